package cli

import (
	"net/url"

	"regexp"
	"strings"
)

// urlSets reports whether the connection string sets param itself (as a
// URL query parameter or a keyword): pool_max_conns, which then wins over
// any size the command computes or is given, or default_query_exec_mode,
// which wins over --database-query-mode.
func urlSets(connString, param string) bool {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		return err == nil && u.Query().Has(param)
	}
	return regexp.MustCompile(`(^|\s)` + regexp.QuoteMeta(param) + `\s*=`).MatchString(connString)
}
