package file

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/filekind"
	"github.com/fencegate/fencegate/outbox"
)

// ErrNotAllowed: the target is outside the adapter's target policy
// (Config.Allow, dotfiles, Config.MaxBytes).
var ErrNotAllowed = fmt.Errorf("file adapter: target not allowed")

// allowed checks target and a content of size bytes against the target
// policy: an Allow pattern must match (none: any target), no segment may
// be a dotfile unless AllowDotfiles, and the content may be at most
// MaxBytes (zero: no limit of its own). The error is a
// *fenceerr.InvalidError naming the payload's field.
func (c Config) allowed(target string, size int) error {
	if err := c.allowedTarget(target); err != nil {
		return err
	}
	if c.MaxBytes > 0 && int64(size) > c.MaxBytes {
		return fenceerr.Invalid("payload.content", "is %d bytes, over the per-target limit of %d (--file-max-bytes)", size, c.MaxBytes)
	}
	return nil
}

// allowedTarget checks a path, the logical target or the path it
// resolves to, against Allow and the dotfile rule.
func (c Config) allowedTarget(target string) error {
	if !c.AllowDotfiles {
		for _, seg := range strings.Split(target, "/") {
			if strings.HasPrefix(seg, ".") {
				return fenceerr.Invalid("payload.target", "segment %q is a dotfile, which this gateway does not publish (--file-allow-dotfiles)", seg)
			}
		}
	}
	if len(c.Allow) > 0 && !matchAny(c.Allow, target) {
		return fenceerr.Invalid("payload.target", "%q matches none of the allowed targets (--file-allow: %s)", target, strings.Join(c.Allow, ", "))
	}
	return nil
}

// matchAny reports whether target matches one of patterns: path.Match
// globs over the whole target ("reports/*.txt"), and "dir/**" for anything
// under dir.
func matchAny(patterns []string, target string) bool {
	for _, p := range patterns {
		if prefix, ok := strings.CutSuffix(p, "/**"); ok {
			if strings.HasPrefix(target, prefix+"/") {
				return true
			}
			continue
		}
		if ok, _ := path.Match(p, target); ok {
			return true
		}
	}
	return false
}

// CheckAllow checks Config.Allow's patterns without making an adapter;
// the error is a *fenceerr.InvalidError naming Allow.
//
// Deprecated: Config.Validate checks them with the rest of the Config.
func CheckAllow(patterns []string) error { return checkPatterns(patterns) }

// checkPatterns checks Allow's patterns.
func checkPatterns(patterns []string) error {
	for _, p := range patterns {
		if _, err := path.Match(strings.TrimSuffix(p, "/**"), ""); err != nil || p == "" {
			return fenceerr.Invalid("Allow", "%q is not a valid pattern (path.Match globs, or dir/**)", p)
		}
	}
	return nil
}

// KindSpec is the file kind as the gateway's own intake registers it: the
// payload rules (filekind) and this adapter's target policy, so that a
// target outside it is refused at enqueue, naming the field.
func (a *Adapter) KindSpec() outbox.KindSpec { return policySpec(a.cfg) }

// IntakeSpec is KindSpec for an intake that has the adapter's target
// policy (Config.Allow, AllowDotfiles, MaxBytes) but not the adapter: a
// gateway that serves the intake and runs the file adapter in another
// process. Root is not needed. The error is a *fenceerr.InvalidError
// naming the Config field.
func IntakeSpec(cfg Config) (outbox.KindSpec, error) {
	if err := checkPatterns(cfg.Allow); err != nil {
		return outbox.KindSpec{}, err
	}
	if cfg.MaxBytes < 0 {
		return outbox.KindSpec{}, fenceerr.Invalid("MaxBytes", "must not be negative, got %d", cfg.MaxBytes)
	}
	return policySpec(cfg), nil
}

func policySpec(cfg Config) outbox.KindSpec {
	return outbox.KindSpec{DefaultFence: outbox.FenceExecute, Check: func(raw json.RawMessage) error {
		p, err := filekind.Parse(raw)
		if err != nil {
			return err
		}
		return cfg.allowed(p.Target, len(p.Data()))
	}}
}
