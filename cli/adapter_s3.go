package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/adapters/s3"
	"github.com/fencegate/fencegate/adapters/webhook"
	"github.com/fencegate/fencegate/internal/errmap"
	"github.com/fencegate/fencegate/outbox"
)

// s3Adapter is the s3 adapter (adapters/s3): objects written to an
// S3-compatible server with conditional writes, in the buckets of an
// allow-list the intake enforces too.
var s3Adapter = builtinAdapter{kind: s3.Kind, flags: newS3Flags, enqueueSpec: s3EnqueueSpec}

type s3Flags struct {
	fs                                       *flag.FlagSet
	endpoint, bucket, allow, secret, secFile *string
	pathStyle                                *bool

	// secrets are the receipt secrets, from --s3-receipt-secret or
	// --s3-receipt-secret-file (check).
	secrets []string
}

func newS3Flags(fs *flag.FlagSet) adapterFlags {
	return &s3Flags{
		fs:        fs,
		endpoint:  fs.String("s3-endpoint", "", "URL of an S3-compatible server for the s3 adapter (default: AWS); credentials from the AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, shared config)"),
		pathStyle: fs.Bool("s3-path-style", false, "path-style addressing (endpoint/bucket/key); on by default when --s3-endpoint is given"),
		bucket:    fs.String("s3-bucket", "", "the s3 adapter's default bucket (required to run it; probed at start: it must enforce conditional writes)"),
		allow:     fs.String("s3-allow", "", "other buckets a payload may name, comma-separated (default: --s3-bucket only); each probed at start"),
		secret:    fs.String("s3-receipt-secret", "", "keys of the s3 receipts' HMAC, comma-separated for rotation (the first signs), each at least 32 bytes; default $GATEWAY_S3_RECEIPT_SECRET, none: no receipts (never printed); prefer --s3-receipt-secret-file"),
		secFile:   fs.String("s3-receipt-secret-file", "", "file holding --s3-receipt-secret (its first line; a warning when group or world can read it)"),
	}
}

func (f *s3Flags) check(env adapterEnv, runs bool) error {
	if runs && *f.bucket == "" {
		return badInput("s3_bucket", "--s3-bucket is required when the s3 adapter runs: the default bucket, where it checks at start that conditional writes are enforced")
	}
	f.secrets = webhook.SplitList(*f.secret)
	if *f.secFile != "" {
		if len(f.secrets) > 0 {
			return badInput("s3_receipt_secret_file", "--s3-receipt-secret-file and --s3-receipt-secret (or $GATEWAY_S3_RECEIPT_SECRET) are both set: give one")
		}
		warnReadable(*f.secFile, "s3_receipt_secret_file", env.log)
		b, err := os.ReadFile(*f.secFile)
		if err != nil {
			return badInput("s3_receipt_secret_file", "--s3-receipt-secret-file: "+oneLine(err.Error()))
		}
		line, _, _ := strings.Cut(string(b), "\n")
		if f.secrets = webhook.SplitList(strings.TrimSuffix(line, "\r")); len(f.secrets) == 0 {
			return badInput("s3_receipt_secret_file", fmt.Sprintf("--s3-receipt-secret-file: %s is empty", *f.secFile))
		}
	}
	return s3Fields.flagError(f.config(env).Validate())
}

// s3Fields maps s3.Config's fields to the flags that set them.
var s3Fields = fieldFlags{
	{path: "Bucket", flag: "s3-bucket"},
	{path: "Allow", flag: "s3-allow"},
	{path: "ReceiptSecrets", flag: "s3-receipt-secret"},
	{path: "Endpoint", flag: "s3-endpoint"},
}

func (f *s3Flags) config(env adapterEnv) s3.Config {
	cfg := s3.Config{Endpoint: *f.endpoint, Bucket: *f.bucket, Allow: webhook.SplitList(*f.allow), ReceiptSecrets: f.secrets, Logger: env.log}
	// --s3-path-style when given, else the adapter's default: on with an
	// endpoint.
	if flagSet(f.fs, "s3-path-style") {
		v := *f.pathStyle
		cfg.PathStyle = &v
	}
	return cfg
}

func (f *s3Flags) registration(ctx context.Context, env adapterEnv) (adapters.Registration, error) {
	a, err := s3.New(ctx, f.config(env))
	if err != nil {
		return adapters.Registration{}, errmap.Map(s3Fields.flagError(err))
	}
	if !a.SignsReceipts() {
		env.log.Warn("gateway: no --s3-receipt-secret: the s3 adapter writes no receipts, so a publication whose answer was lost and whose object a newer one replaced before the lookup is not found; a receipt found is held for an operator, not trusted",
			"component", "gateway")
	}
	reg := a.Registration()
	probe := reg.Probe
	reg.Probe = func(ctx context.Context) error {
		if err := probe(ctx); err != nil {
			if errors.Is(err, s3.ErrConditionsIgnored) {
				return badInput("s3_endpoint", "--s3-endpoint: "+err.Error())
			}
			// Anything else is the gateway's to report (unavailable,
			// naming the kind, which the adapter's errors already do).
			return err
		}
		env.log.Info("gateway: s3 buckets enforce conditional writes", "component", "gateway", "buckets", strings.Join(a.Allowed(), ","))
		return nil
	}
	return reg, nil
}

// intake: the default bucket and the allow-list, when given.
func (f *s3Flags) intake(set func(string) bool) (outbox.KindSpec, bool, error) {
	if !set("s3-bucket") && !set("s3-allow") {
		return outbox.KindSpec{}, false, nil
	}
	spec, err := s3.IntakeSpec(*f.bucket, webhook.SplitList(*f.allow))
	if err != nil {
		return outbox.KindSpec{}, false, s3Fields.flagError(err)
	}
	return spec, true, nil
}

// s3EnqueueSpec: where the gateway's buckets are known to gateway enqueue
// too ($GATEWAY_S3_BUCKET, $GATEWAY_S3_ALLOW, as the gateway's), enqueue
// refuses a payload naming another bucket. A variable that gateway run
// would refuse is bad input naming its flag's field (s3_bucket,
// s3_allow): never the kind's default rules in its place, which would let
// any bucket through.
func s3EnqueueSpec(getenv func(string) string) (outbox.KindSpec, bool, error) {
	bucket, allow := getenv("GATEWAY_S3_BUCKET"), webhook.SplitList(getenv("GATEWAY_S3_ALLOW"))
	if bucket == "" && len(allow) == 0 {
		return outbox.KindSpec{}, false, nil
	}
	spec, err := s3.IntakeSpec(bucket, allow)
	if err != nil {
		err = s3Fields.flagError(err)
		env := "GATEWAY_S3_ALLOW"
		if fieldOf(err) == "s3_bucket" {
			env = "GATEWAY_S3_BUCKET"
		}
		return outbox.KindSpec{}, false, envError(env, err)
	}
	return spec, true, nil
}
