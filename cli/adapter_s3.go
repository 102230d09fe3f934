package cli

import (
	"context"
	"errors"
	"flag"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/s3"
	"github.com/fencegate/fencegate/internal/errmap"
)

// s3Adapter is the s3 adapter (adapters/s3): objects written to an
// S3-compatible server with conditional writes.
var s3Adapter = builtinAdapter{kind: s3.Kind, flags: newS3Flags}

type s3Flags struct {
	fs               *flag.FlagSet
	endpoint, bucket *string
	pathStyle        *bool
}

func newS3Flags(fs *flag.FlagSet) adapterFlags {
	return &s3Flags{
		fs:        fs,
		endpoint:  fs.String("s3-endpoint", "", "URL of an S3-compatible server for the s3 adapter (default: AWS); credentials from the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, shared config)"),
		pathStyle: fs.Bool("s3-path-style", false, "path-style addressing (endpoint/bucket/key); on by default when --s3-endpoint is given"),
		bucket:    fs.String("s3-bucket", "", "the s3 adapter's default bucket (required to run it; probed at start: it must enforce conditional writes)"),
	}
}

func (f *s3Flags) check(_ adapterEnv, runs bool) error {
	if runs && *f.bucket == "" {
		return badInput("s3_bucket", "--s3-bucket is required when the s3 adapter runs: the default bucket, where it checks at start that conditional writes are enforced")
	}
	return nil
}

func (f *s3Flags) registration(ctx context.Context, env adapterEnv) (adapters.Registration, error) {
	cfg := s3.Config{Endpoint: *f.endpoint, Bucket: *f.bucket, Logger: env.log}
	// --s3-path-style when given, else the adapter's default: on with an
	// endpoint.
	if flagSet(f.fs, "s3-path-style") {
		v := *f.pathStyle
		cfg.PathStyle = &v
	}
	a, err := s3.New(ctx, cfg)
	if err != nil {
		return adapters.Registration{}, errmap.Map(err)
	}
	reg := a.Registration()
	probe := reg.Probe
	reg.Probe = func(ctx context.Context) error {
		if err := probe(ctx); err != nil {
			if errors.Is(err, s3.ErrConditionsIgnored) {
				return badInput("s3_endpoint", "--s3-endpoint: "+err.Error())
			}
			if m := errmap.Map(err); m.Code == errmap.InvalidInput {
				return m
			}
			return errmap.New(errmap.Unavailable, "s3: "+oneLine(err.Error()))
		}
		env.log.Info("gateway: s3 bucket enforces conditional writes", "component", "gateway", "bucket", cfg.Bucket)
		return nil
	}
	return reg, nil
}
