package cli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/file"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/outbox"
)

// defaultFileRoot is --file-root's default.
const defaultFileRoot = "./var/files"

// fileAdapter is the file adapter (adapters/file): files published under a
// root, with a target policy the intake enforces too.
var fileAdapter = builtinAdapter{kind: file.Kind, flags: newFileFlags}

type fileFlags struct {
	root, allow, mode *string
	dots              *bool
	maxBytes          *int64

	// fileMode is --file-mode, parsed (check).
	fileMode os.FileMode
}

func newFileFlags(fs *flag.FlagSet) adapterFlags {
	return &fileFlags{
		root:     fs.String("file-root", defaultFileRoot, "directory the file adapter publishes under (created if missing)"),
		allow:    fs.String("file-allow", "", "targets the file adapter may publish, comma-separated globs over the whole target (reports/*.txt) or dir/** (default: any)"),
		dots:     fs.Bool("file-allow-dotfiles", false, "let targets have segments starting with '.' (refused by default)"),
		mode:     fs.String("file-mode", "0644", "mode of published files and their manifests, octal, including 0600 (exactly: the process umask does not apply)"),
		maxBytes: fs.Int64("file-max-bytes", 0, "largest content published to one target (0: the payload limit only)"),
	}
}

// fileFields maps file.Config's fields to the flags that set them.
var fileFields = fieldFlags{
	{path: "Root", flag: "file-root", msg: "--file-root must not be empty when the file adapter runs"},
	{path: "Allow", flag: "file-allow"},
	{path: "FileMode", flag: "file-mode"},
	{path: "MaxBytes", flag: "file-max-bytes"},
}

// intake: the target policy (--file-allow, --file-allow-dotfiles,
// --file-max-bytes), when any of it is given.
func (f *fileFlags) intake(set func(string) bool) (outbox.KindSpec, bool, error) {
	if !set("file-allow") && !set("file-allow-dotfiles") && !set("file-max-bytes") {
		return outbox.KindSpec{}, false, nil
	}
	spec, err := file.IntakeSpec(file.Config{Allow: webhook.SplitList(*f.allow), AllowDotfiles: *f.dots, MaxBytes: *f.maxBytes})
	if err != nil {
		return outbox.KindSpec{}, false, fileFields.flagError(err)
	}
	return spec, true, nil
}

// config is the adapter's Config the flags give.
func (f *fileFlags) config(env adapterEnv) file.Config {
	return file.Config{Root: *f.root, Allow: webhook.SplitList(*f.allow), AllowDotfiles: *f.dots,
		FileMode: f.fileMode, MaxBytes: *f.maxBytes, Registerer: env.registry, Logger: env.log}
}

func (f *fileFlags) check(env adapterEnv, runs bool) error {
	mode, err := parseMode(*f.mode)
	if err != nil {
		return err
	}
	f.fileMode = mode
	cfg := f.config(env)
	if !runs {
		// Only a running adapter needs a root: a stand-in for none keeps
		// the other flags checked.
		cfg.Root = cmp.Or(cfg.Root, defaultFileRoot)
	}
	return fileFields.flagError(cfg.Validate())
}

func (f *fileFlags) registration(_ context.Context, env adapterEnv) (adapters.Registration, error) {
	a, err := file.New(f.config(env))
	if errors.Is(err, fenceerr.ErrInvalid) {
		return adapters.Registration{}, fileFields.flagError(err)
	}
	if err != nil {
		// The root could not be made.
		return adapters.Registration{}, badInput("file_root", oneLine(err.Error()))
	}
	return a.Registration(), nil
}

// parseMode reads --file-mode: octal permission bits.
func parseMode(v string) (os.FileMode, error) {
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m&^0o777 != 0 || m&0o600 != 0o600 {
		return 0, badInput("file_mode", fmt.Sprintf("--file-mode must be octal permission bits including 0600, e.g. 0644; got %q", v))
	}
	return os.FileMode(m), nil
}
