package validate

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// portProto is one port of one protocol.
type portProto struct {
	proto corev1.Protocol
	port  int32
}

func (p portProto) String() string { return fmt.Sprintf("%s/%d", p.proto, p.port) }

// dns is what every pod needs to resolve the names it is given.
var dns = []portProto{{corev1.ProtocolUDP, 53}, {corev1.ProtocolTCP, 53}}

// The NetworkPolicies (networkpolicy.yaml) isolate every pod of the base,
// both ways, and allow what each one uses and nothing more: egress to the
// ports of DNS, of the database URL, of the NATS seeds and of the SMTP
// relay where the email adapter runs (from its command line, ConfigMap and
// Secret), no other port; ingress on each port it listens on, the metrics
// port (metrics, and readiness errors naming hosts and users) from named
// peers only, never from anyone.
func TestNetworkPolicies(t *testing.T) {
	t.Parallel()
	b := render(t)
	if len(b.policies) == 0 {
		t.Fatal("no NetworkPolicy: every pod accepts any connection and opens any (docs/operations.md says of --metrics-allow-remote: firewall it)")
	}
	for _, p := range b.policies {
		if len(p.Spec.PolicyTypes) == 0 {
			t.Errorf("NetworkPolicy %s: no policyTypes (say Ingress, Egress or both)", p.Name)
		}
	}
	for _, w := range b.workloads() {
		checkEgress(t, b, w)
		checkIngress(t, b, w)
	}
	// Each port an ingress rule names is one a pod it selects listens on.
	for _, p := range b.policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Spec.Ingress {
			for _, pp := range r.Ports {
				found := false
				for _, w := range b.workloads() {
					if sel.Matches(labels.Set(w.pod.Labels)) && pp.Port != nil {
						_, ok := containerPort(w.pod.Spec.Containers[0], pp)
						found = found || ok
					}
				}
				if !found {
					t.Errorf("NetworkPolicy %s allows ingress on port %v, which no pod it selects listens on", p.Name, pp.Port)
				}
			}
		}
	}
}

// policiesFor returns the policies that select w's pods for direction typ.
func policiesFor(t *testing.T, b *base, w workload, typ networkingv1.PolicyType) []*networkingv1.NetworkPolicy {
	t.Helper()
	var out []*networkingv1.NetworkPolicy
	for _, p := range b.policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			t.Fatalf("NetworkPolicy %s: %v", p.Name, err)
		}
		if sel.Matches(labels.Set(w.pod.Labels)) && slices.Contains(p.Spec.PolicyTypes, typ) {
			out = append(out, p)
		}
	}
	return out
}

// checkEgress: the ports w's pods are allowed to reach are exactly the
// ones they use.
func checkEgress(t *testing.T, b *base, w workload) {
	t.Helper()
	ps := policiesFor(t, b, w, networkingv1.PolicyTypeEgress)
	if len(ps) == 0 {
		t.Errorf("%s: no NetworkPolicy restricts its pods' egress", w.name)
		return
	}
	need := map[portProto]string{}
	for _, p := range dns {
		need[p] = "DNS"
	}
	c := w.pod.Spec.Containers[0]
	env := containerEnv(b, c)
	cfg := map[string]string{"database-url": env["GATEWAY_DATABASE_URL"]}
	if len(c.Args) > 0 && c.Args[0] == "run" {
		var err error
		if cfg, err = printConfig(c.Args, env); err != nil {
			t.Errorf("%s: %v", w.name, err)
			return
		}
		for _, u := range strings.Split(cfg["nats-url"], ",") {
			addPorts(t, w.name, need, "nats-url", u, 4222)
		}
		for a := range strings.SplitSeq(cfg["adapters"], ",") {
			switch a = strings.TrimSpace(a); a {
			case "", "file":
			case "email":
				_, port, err := net.SplitHostPort(cfg["smtp-addr"])
				n, err2 := strconv.ParseUint(port, 10, 16)
				if err != nil || err2 != nil {
					t.Errorf("%s: --smtp-addr %q: no port", w.name, cfg["smtp-addr"])
					continue
				}
				need[portProto{corev1.ProtocolTCP, int32(n)}] = "smtp-addr"
				if cfg["mail-lookup"] == "mailpit" {
					addPorts(t, w.name, need, "mailpit-url", cfg["mailpit-url"], 0)
				}
			default:
				t.Errorf("%s runs the %s adapter: this test does not know its destinations' ports (add them here and to networkpolicy.yaml)", w.name, a)
			}
		}
	}
	for _, f := range []string{"database-url", "database-direct-url"} {
		if cfg[f] != "" {
			addPorts(t, w.name, need, f, cfg[f], 5432)
		}
	}
	allowed := map[portProto]string{}
	for _, p := range ps {
		for i, r := range p.Spec.Egress {
			if len(r.Ports) == 0 {
				t.Errorf("%s: NetworkPolicy %s egress rule %d allows every port", w.name, p.Name, i+1)
			}
			for _, pp := range r.Ports {
				proto := corev1.ProtocolTCP
				if pp.Protocol != nil {
					proto = *pp.Protocol
				}
				if pp.Port == nil || pp.Port.StrVal != "" || pp.EndPort != nil {
					t.Errorf("%s: NetworkPolicy %s egress rule %d: port %v (end %v): want one port by number", w.name, p.Name, i+1, pp.Port, pp.EndPort)
					continue
				}
				allowed[portProto{proto, pp.Port.IntVal}] = p.Name
			}
		}
	}
	for p, why := range need {
		if _, ok := allowed[p]; !ok {
			t.Errorf("%s: egress to %s (%s) is not allowed", w.name, p, why)
		}
	}
	var ports []string
	for p, pol := range allowed {
		ports = append(ports, p.String())
		if _, ok := need[p]; !ok {
			t.Errorf("%s: NetworkPolicy %s allows egress to %s, which the pods do not use", w.name, pol, p)
		}
	}
	sort.Strings(ports)
	t.Logf("%s: egress to %s", w.name, strings.Join(ports, ", "))
}

// addPorts adds the ports of a URL, or of each host of a multi-host
// PostgreSQL URL (def when a host gives none; 0: the scheme's).
func addPorts(t *testing.T, where string, need map[portProto]string, flag, raw string, def int32) {
	t.Helper()
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" {
		t.Errorf("%s: --%s %q: not a URL with a host (%v)", where, flag, raw, err)
		return
	}
	if def == 0 {
		def = map[string]int32{"http": 80, "https": 443}[u.Scheme]
	}
	for _, h := range strings.Split(u.Host, ",") {
		port := def
		if _, p, err := net.SplitHostPort(h); err == nil {
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil {
				t.Errorf("%s: --%s: port %q", where, flag, p)
				continue
			}
			port = int32(n)
		}
		if port == 0 {
			t.Errorf("%s: --%s %q: no port", where, flag, raw)
			continue
		}
		need[portProto{corev1.ProtocolTCP, port}] = flag
	}
}

// containerPort resolves a policy's port (a name or a number) against c's.
func containerPort(c corev1.Container, pp networkingv1.NetworkPolicyPort) (corev1.ContainerPort, bool) {
	proto := corev1.ProtocolTCP
	if pp.Protocol != nil {
		proto = *pp.Protocol
	}
	for _, cp := range c.Ports {
		cpProto := cmp.Or(cp.Protocol, corev1.ProtocolTCP)
		if cpProto == proto && (pp.Port.StrVal != "" && pp.Port.StrVal == cp.Name || pp.Port.StrVal == "" && pp.Port.IntVal == cp.ContainerPort) {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

// checkIngress: w's pods are isolated for ingress; each port they listen
// on is allowed, the metrics port from named peers only.
func checkIngress(t *testing.T, b *base, w workload) {
	t.Helper()
	ps := policiesFor(t, b, w, networkingv1.PolicyTypeIngress)
	if len(ps) == 0 {
		t.Errorf("%s: no NetworkPolicy restricts who reaches its pods", w.name)
		return
	}
	c := w.pod.Spec.Containers[0]
	for _, cp := range c.Ports {
		var froms [][]networkingv1.NetworkPolicyPeer
		for _, p := range ps {
			for i, r := range p.Spec.Ingress {
				if len(r.Ports) == 0 {
					t.Errorf("%s: NetworkPolicy %s ingress rule %d allows every port", w.name, p.Name, i+1)
				}
				for _, pp := range r.Ports {
					if got, ok := containerPort(c, pp); ok && got.Name == cp.Name {
						froms = append(froms, r.From)
					}
				}
			}
		}
		switch {
		case len(froms) == 0:
			t.Errorf("%s: no NetworkPolicy allows ingress on its port %s (%d)", w.name, cp.Name, cp.ContainerPort)
		case cp.Name == "metrics":
			for _, f := range froms {
				if len(f) == 0 {
					t.Errorf("%s: the metrics port is open to anyone: allow Prometheus only", w.name)
				}
			}
		}
		t.Logf("%s: ingress on %s from %d rules", w.name, cp.Name, len(froms))
	}
}
