package cli

import (
	"net/url"

	"regexp"
	"strings"
)

// dsnMaxConns matches pool_max_conns in a keyword/value connection string.
var dsnMaxConns = regexp.MustCompile(`(^|\s)pool_max_conns\s*=`)

// urlSetsMaxConns reports whether the connection string sets
// pool_max_conns itself (as a URL query parameter or a keyword), which then
// wins over any size the command computes or is given.
func urlSetsMaxConns(connString string) bool {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		return err == nil && u.Query().Has("pool_max_conns")
	}
	return dsnMaxConns.MatchString(connString)
}
