// Package buildinfo says which build of fencegate is running: `gateway
// --version` and the fencegate_build_info metric.
package buildinfo

import (
	"cmp"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is set by release builds (-ldflags "-X
// github.com/fencegate/fencegate/internal/buildinfo.Version=v1.2.3");
// otherwise the module's version from the build info ("(devel)" for a
// build from a checkout).
var Version string

// Info is a build's identity.
type Info struct {
	Version string `json:"version"`
	// Commit is the VCS revision the binary was built from ("" when
	// unknown), with "-dirty" when the tree had changes.
	Commit string `json:"commit"`
	Go     string `json:"go"`
}

// Get returns the running build's Info.
func Get() Info {
	i := Info{Version: Version, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		i.Version = cmp.Or(i.Version, bi.Main.Version)
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && i.Commit != "" {
			i.Commit += "-dirty"
		}
	}
	i.Version = cmp.Or(i.Version, "(unknown)")
	return i
}

// Collector is the fencegate_build_info gauge: always 1, with the build's
// version, commit and Go version as labels.
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencegate_build_info",
		Help: "The running build of fencegate: always 1; version, commit and go are labels.",
	}, []string{"version", "commit", "go"})
	g.WithLabelValues(i.Version, i.Commit, i.Go).Set(1)
	return g
}
