package webhook

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/fencegate/fencegate/fenceerr"
)

// Hosts is a list of destinations, each "host" (any port) or "host:port";
// a host is a DNS name (matched case-insensitively, exactly: no wildcards)
// or an IP address ("[::1]:8080" for IPv6 with a port).
type Hosts struct {
	entries []hostEntry
}

type hostEntry struct {
	host string // lower case; an IP address in its canonical form
	port int    // 0: any port
	ip   netip.Addr
}

// SplitList splits a comma- or space-separated list (a flag's value).
func SplitList(list string) []string {
	return strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
}

// ParseHosts parses the entries of a list. field names the input in errors
// ("Allow"), which name a bad entry by its position (from 1), never
// echoing it: an entry given as a URL may carry a password.
func ParseHosts(field string, items []string) (*Hosts, error) {
	h := &Hosts{}
	for i, item := range items {
		e, err := parseHostEntry(item)
		if err != nil {
			return nil, fenceerr.Invalid(field, "entry %d of %d: %v", i+1, len(items), err)
		}
		h.entries = append(h.entries, e)
	}
	return h, nil
}

func parseHostEntry(item string) (hostEntry, error) {
	if strings.Contains(item, "://") || strings.ContainsAny(item, "/?#@") {
		return hostEntry{}, fmt.Errorf("must be host or host:port, not a URL")
	}
	host, portStr := item, ""
	if strings.HasPrefix(item, "[") || strings.Count(item, ":") == 1 {
		var err error
		if host, portStr, err = net.SplitHostPort(item); err != nil {
			if !strings.HasPrefix(item, "[") || !strings.HasSuffix(item, "]") {
				// Not SplitHostPort's error: it quotes the entry.
				return hostEntry{}, fmt.Errorf("must be host or host:port (an IPv6 address with a port in brackets)")
			}
			host = strings.Trim(item, "[]")
		}
	}
	e := hostEntry{host: strings.ToLower(strings.TrimSuffix(host, "."))}
	if portStr != "" {
		p, err := strconv.Atoi(portStr)
		if err != nil || p < 1 || p > 65535 {
			return hostEntry{}, fmt.Errorf("port must be 1-65535")
		}
		e.port = p
	}
	if e.host == "" || strings.Contains(e.host, "*") {
		return hostEntry{}, fmt.Errorf("must name one host (no wildcards)")
	}
	if ip, err := netip.ParseAddr(e.host); err == nil {
		e.ip = ip.Unmap()
		e.host = e.ip.String()
		return e, nil
	}
	// Not an address: a DNS name (letters, digits, '-', '_' and dots
	// between non-empty labels; non-ASCII letters of an IDN are let
	// through). Anything else (x:1:2, a space) would be kept as a name no
	// URL's host ever equals: an entry that silently allows nothing.
	for _, label := range strings.Split(e.host, ".") {
		if label == "" {
			return hostEntry{}, fmt.Errorf("must be a DNS name or an IP address (an empty label)")
		}
		for _, r := range label {
			if r < 0x80 && !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return hostEntry{}, fmt.Errorf("must be a DNS name or an IP address (letters, digits, '-', '_' and dots)")
			}
		}
	}
	return e, nil
}

// Len is the number of entries.
func (h *Hosts) Len() int {
	if h == nil {
		return 0
	}
	return len(h.entries)
}

// String lists the entries as parsed.
func (h *Hosts) String() string {
	if h == nil {
		return ""
	}
	out := make([]string, len(h.entries))
	for i, e := range h.entries {
		out[i] = e.host
		if e.ip.Is6() {
			out[i] = "[" + e.host + "]"
		}
		if e.port != 0 {
			out[i] += ":" + strconv.Itoa(e.port)
		}
	}
	return strings.Join(out, ",")
}

// Match reports whether host (a name or an IP) on port is listed.
func (h *Hosts) Match(host string, port int) bool {
	if h == nil {
		return false
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if ip, err := netip.ParseAddr(host); err == nil {
		return h.MatchIP(ip, port)
	}
	for _, e := range h.entries {
		if !e.ip.IsValid() && e.host == host && (e.port == 0 || e.port == port) {
			return true
		}
	}
	return false
}

// MatchIP reports whether the address ip on port is listed as an address.
func (h *Hosts) MatchIP(ip netip.Addr, port int) bool {
	if h == nil {
		return false
	}
	ip = ip.Unmap()
	for _, e := range h.entries {
		if e.ip.IsValid() && e.ip == ip && (e.port == 0 || e.port == port) {
			return true
		}
	}
	return false
}

// hostPort returns u's host (without brackets) and port (the scheme's
// default when absent).
func hostPort(u *url.URL) (string, int) {
	port, _ := strconv.Atoi(u.Port())
	if port == 0 {
		port = 80
		if u.Scheme == "https" {
			port = 443
		}
	}
	return u.Hostname(), port
}

// internal reports whether ip is an address a name on the public Internet
// must not resolve to for us: loopback, private (RFC 1918, RFC 4193),
// link-local, unspecified, multicast, CGNAT (RFC 6598) and the like.
func internal(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return true
	}
	for _, p := range reservedPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// reservedPrefixes are internal ranges the netip predicates do not cover.
var reservedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),  // CGNAT, RFC 6598
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking, RFC 2544
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and broadcast
	netip.MustParsePrefix("64:ff9b::/96"),   // NAT64: can embed an internal IPv4
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64, RFC 8215
	netip.MustParsePrefix("100::/64"),       // discard-only, RFC 6666
	netip.MustParsePrefix("fec0::/10"),      // site-local (deprecated)
	netip.MustParsePrefix("2002::/16"),      // 6to4: can embed an internal IPv4
	netip.MustParsePrefix("2001::/32"),      // Teredo: can embed one too
}
