package s3

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/fencegate/fencegate/adapters"
	"github.com/fencegate/fencegate/fenceerr"
	"github.com/fencegate/fencegate/kinds/s3kind"
	"github.com/fencegate/fencegate/outbox"
)

// Kind is the intent kind the adapter executes.
const Kind = s3kind.Name

// The object metadata the adapter writes with every publication
// (x-amz-meta-…): who published it, under which epoch, with what content.
const (
	MetaEpoch    = "fencegate-epoch"
	MetaResource = "fencegate-resource"
	MetaIntentID = "fencegate-intent-id"
	MetaKey      = "fencegate-idempotency-key" // query-escaped
	MetaSHA256   = "fencegate-sha256"
)

// DefaultReceiptPrefix is Config.ReceiptPrefix's default.
const DefaultReceiptPrefix = s3kind.ReservedDir + "/receipts/"

// MinReceiptSecret is the shortest receipt secret accepted, in bytes.
const MinReceiptSecret = 32

// maxCAS bounds the read-compare-write rounds of one publication: each
// lost round means another publisher wrote in between.
const maxCAS = 8

// Errors, matched with errors.Is.
var (
	// ErrConditionsIgnored: the server accepted a conditional write whose
	// condition was false: it would silently turn the fence off.
	ErrConditionsIgnored = errors.New("s3: the server ignores conditional writes (If-Match / If-None-Match)")
	// ErrBadPayload: the payload is not a valid s3 payload.
	ErrBadPayload = errors.New("s3: invalid payload")
	// ErrBucketNotAllowed: the payload names a bucket outside the
	// allow-list (Config.Bucket and Config.Allow).
	ErrBucketNotAllowed = errors.New("s3: bucket not allowed")
)

// Config configures the adapter.
type Config struct {
	// Bucket is the default bucket (a payload without "bucket"); it is
	// always allowed. Required by gateway run (--s3-bucket).
	Bucket string
	// Allow lists the other buckets a payload may name (--s3-allow);
	// empty: Bucket only. A payload naming any other is refused at the
	// intake (KindSpec) and fails at execute, with nothing sent. Probe
	// checks every allowed bucket.
	Allow []string
	// ReceiptSecrets are the keys of the receipts' HMAC-SHA256
	// (--s3-receipt-secret), each at least MinReceiptSecret bytes: the
	// first signs, any verifies (rotation: put the new one first, drop
	// the old one once no receipt it signed can still be needed). Empty:
	// no receipt is written, and none found is proof.
	ReceiptSecrets []string
	// Endpoint is an S3-compatible server's URL (--s3-endpoint). Empty:
	// AWS.
	Endpoint string
	// PathStyle addresses buckets in the path (endpoint/bucket/key).
	// Default: on when Endpoint is set.
	PathStyle *bool
	// Region. Default: the AWS environment's (AWS_REGION, shared config),
	// else us-east-1.
	Region string
	// Client, when set, is used as is (tests); otherwise one is made from
	// the standard AWS environment and shared config (AWS_ACCESS_KEY_ID,
	// AWS_SECRET_ACCESS_KEY, AWS_PROFILE, …), with TLS verification on.
	Client *s3.Client
	// ReceiptPrefix is where a receipt of every publication is kept, so
	// that a lookup finds an effect after a newer publication replaced
	// the object. Default DefaultReceiptPrefix; it must be under
	// .fencegate/, the keys no payload can name.
	ReceiptPrefix string
	// LookupSettle: how long after a publication's last request a lookup
	// that finds nothing is proof. Zero: the runtime's.
	LookupSettle time.Duration
	// Concurrency: publications in flight at most. Zero: the runtime's.
	Concurrency int
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Adapter publishes objects. It is safe for concurrent use.
type Adapter struct {
	cfg     Config
	client  *s3.Client
	log     *slog.Logger
	allowed map[string]bool
	secrets [][]byte
}

var (
	_ adapters.Executor = (*Adapter)(nil)
	_ adapters.Looker   = (*Adapter)(nil)
)

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.ReceiptPrefix = cmp.Or(c.ReceiptPrefix, DefaultReceiptPrefix)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// Validate checks c, its defaults applied, sending nothing and reading no
// AWS configuration. An error is a *fenceerr.InvalidError naming the field
// (Bucket, Allow, ReceiptSecrets, Endpoint, …); none repeats a secret.
func (c Config) Validate() error {
	_, _, err := c.WithDefaults().parse()
	return err
}

// parse checks c and returns its allow-list and receipt secrets.
func (c Config) parse() (allowed map[string]bool, secrets [][]byte, err error) {
	if c.Bucket != "" {
		if err := s3kind.CheckBucket("Bucket", c.Bucket); err != nil {
			return nil, nil, err
		}
	}
	if allowed, err = allowSet(c.Bucket, c.Allow); err != nil {
		return nil, nil, err
	}
	if secrets, err = receiptSecrets(c.ReceiptSecrets); err != nil {
		return nil, nil, err
	}
	if !strings.HasSuffix(c.ReceiptPrefix, "/") || !s3kind.ReservedKey(c.ReceiptPrefix+"x") {
		return nil, nil, fenceerr.Invalid("ReceiptPrefix", "%q must end in '/' and be under %s/, where no payload can write", c.ReceiptPrefix, s3kind.ReservedDir)
	}
	if c.Endpoint != "" {
		// Not echoed: an endpoint may carry a password. A query the SDK
		// refuses only when it first resolves an endpoint, echoing it
		// ("Custom endpoint `…` was not a valid URI"); user info it
		// ignores (credentials come from the AWS configuration); a
		// fragment means nothing here: each is refused now.
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fenceerr.Invalid("Endpoint", "must be an http:// or https:// URL with a host (not shown: it may hold a password)")
		}
		if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.HasSuffix(c.Endpoint, "#") {
			return nil, nil, fenceerr.Invalid("Endpoint", "must be a URL without user info, query or fragment: credentials come from the AWS configuration "+
				"(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, shared config) (not shown: it may hold a password)")
		}
	}
	switch {
	case c.LookupSettle < 0:
		return nil, nil, fenceerr.Invalid("LookupSettle", "must not be negative, got %s", c.LookupSettle)
	case c.Concurrency < 0:
		return nil, nil, fenceerr.Invalid("Concurrency", "must not be negative, got %d", c.Concurrency)
	}
	return allowed, secrets, nil
}

// New checks cfg and makes the client. It sends no request (Probe does).
func New(ctx context.Context, cfg Config) (*Adapter, error) {
	cfg = cfg.WithDefaults()
	allowed, secrets, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	client := cfg.Client
	if client == nil {
		var opts []func(*awsconfig.LoadOptions) error
		if cfg.Region != "" {
			opts = append(opts, awsconfig.WithRegion(cfg.Region))
		}
		awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			return nil, fenceerr.Invalid("s3", "load the AWS configuration: %v", err)
		}
		if awsCfg.Region == "" {
			awsCfg.Region = "us-east-1"
		}
		pathStyle := cfg.Endpoint != ""
		if cfg.PathStyle != nil {
			pathStyle = *cfg.PathStyle
		}
		client = s3.NewFromConfig(awsCfg, func(o *s3.Options) {
			if cfg.Endpoint != "" {
				o.BaseEndpoint = aws.String(cfg.Endpoint)
			}
			o.UsePathStyle = pathStyle
			// One attempt per call: the runtime retries, and an error's
			// class (nothing sent, refused, unknown) is decided here. Writes
			// are held to one attempt by writeOnce whatever the client.
			o.RetryMaxAttempts = 1
		})
	}
	return &Adapter{cfg: cfg, client: client, log: cfg.Logger.With("component", "s3"), allowed: allowed, secrets: secrets}, nil
}

// allowSet is the allow-list: the default bucket and allow, each a valid
// bucket name.
func allowSet(bucket string, allow []string) (map[string]bool, error) {
	set := map[string]bool{}
	if bucket != "" {
		set[bucket] = true
	}
	for _, b := range allow {
		if err := s3kind.CheckBucket("Allow", b); err != nil {
			return nil, err
		}
		set[b] = true
	}
	return set, nil
}

func receiptSecrets(list []string) ([][]byte, error) {
	var out [][]byte
	for i, s := range list {
		if len(s) < MinReceiptSecret {
			// The secret itself is never in the message.
			return nil, fenceerr.Invalid("ReceiptSecrets", "receipt secret %d of %d is %d bytes, under %d: use e.g. 32 random bytes in base64 (openssl rand -base64 32)", i+1, len(list), len(s), MinReceiptSecret)
		}
		out = append(out, []byte(s))
	}
	return out, nil
}

// Allowed returns the buckets a payload may name, sorted: the default
// bucket and Config.Allow.
func (a *Adapter) Allowed() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for b := range a.allowed {
			if !yield(b) {
				return
			}
		}
	})
}

// SignsReceipts reports whether the adapter has a receipt secret: its
// receipts are written, signed, and found ones verified.
func (a *Adapter) SignsReceipts() bool { return len(a.secrets) > 0 }

// KindSpec is the s3 kind's intake rules with the adapter's allow-list:
// the payload's rules (s3kind.Parse) and, when it names a bucket, one
// that is allowed (an error naming payload.bucket otherwise).
func (a *Adapter) KindSpec() outbox.KindSpec { return kindSpec(a.allowed) }

// IntakeSpec is KindSpec for an intake that has the gateway's settings but
// not its adapter (gateway enqueue with the gateway's environment, a relay
// serving the intake): the default bucket and the allow-list, each checked
// (an *fenceerr.InvalidError naming Bucket or Allow). An empty bucket and
// allow-list: the payload's rules only.
func IntakeSpec(bucket string, allow []string) (outbox.KindSpec, error) {
	if bucket != "" {
		if err := s3kind.CheckBucket("Bucket", bucket); err != nil {
			return outbox.KindSpec{}, err
		}
	}
	set, err := allowSet(bucket, allow)
	if err != nil {
		return outbox.KindSpec{}, err
	}
	if len(set) == 0 {
		return outbox.DefaultKinds()[Kind], nil
	}
	return kindSpec(set), nil
}

func kindSpec(allowed map[string]bool) outbox.KindSpec {
	return outbox.KindSpec{DefaultFence: outbox.FenceExecute, Check: func(raw json.RawMessage) error {
		p, err := s3kind.Parse(raw)
		if err != nil {
			return err
		}
		if p.Bucket != "" && !allowed[p.Bucket] {
			return fenceerr.Invalid("payload.bucket", "bucket %q is not allowed: the gateway publishes only to its default bucket (--s3-bucket) and those of --s3-allow", p.Bucket)
		}
		return nil
	}}
}

// writeOnce is the option of every call that writes: the SDK's retryer
// is off for it, whatever client the adapter was given (Config.Client
// keeps its own retryer for reads). The SDK's standard retryer resends a
// request after a connection error — a PutObject whose answer was lost
// after the server took it, the unknown outcome the runtime must see —
// and the second PUT's 412 would then read as "ours already": a write
// sent twice inside one attempt, hidden. net/http itself never resends
// these requests: it replays only GET-like requests and those with an
// Idempotency-Key header, and only bodies it can rewind (GetBody, which
// the SDK does not set); a PUT or DELETE here is neither.
func writeOnce(o *s3.Options) { o.Retryer = aws.NopRetryer{} }

// Kind returns "s3".
func (a *Adapter) Kind() string { return Kind }

// Registration is the adapter as gateway.Config.Adapters takes it: the s3
// kind with its payload's rules, the adapter as its executor, and Probe
// run at start, before anything is consumed: a server that ignores
// conditional writes would turn the destination's fence off without a
// sound.
func (a *Adapter) Registration() adapters.Registration {
	return adapters.Registration{Kind: Kind, Spec: a.KindSpec(), Executor: a, Probe: a.Probe}
}

// Capabilities: the object's metadata (and the receipts) answer lookups.
func (a *Adapter) Capabilities() adapters.Capabilities {
	return adapters.Capabilities{Lookup: true, LookupSettle: a.cfg.LookupSettle, Concurrency: a.cfg.Concurrency}
}

// Probe checks that the server enforces conditional writes on every
// allowed bucket (Allowed): in each, a write with a wrong If-Match, and
// one with If-None-Match: * on an existing object, must both be refused
// (412). It writes and deletes one small object under .fencegate/probe/ in
// each. A bucket whose server accepts them would silently turn the fence
// off: the error then matches ErrConditionsIgnored, and the adapter must
// not run. Every error names the bucket.
func (a *Adapter) Probe(ctx context.Context) error {
	if a.cfg.Bucket == "" {
		return fenceerr.Invalid("Bucket", "is required to probe: the default bucket, where the adapter checks that conditional writes are enforced")
	}
	for _, bucket := range a.Allowed() {
		if err := a.probe(ctx, bucket); err != nil {
			return err
		}
	}
	return nil
}

func (a *Adapter) probe(ctx context.Context, bucket string) error {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	key := s3kind.ReservedDir + "/probe/" + hex.EncodeToString(b)
	put := func(cond func(*s3.PutObjectInput)) error {
		in := &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader([]byte("probe"))}
		if cond != nil {
			cond(in)
		}
		_, err := a.client.PutObject(ctx, in, writeOnce)
		return err
	}
	if err := put(nil); err != nil {
		return fmt.Errorf("s3: probe bucket %q: %w", bucket, err)
	}
	defer func() {
		_, _ = a.client.DeleteObject(context.WithoutCancel(ctx), &s3.DeleteObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)}, writeOnce)
	}()
	for name, cond := range map[string]func(*s3.PutObjectInput){
		`If-Match: <a wrong ETag>`: func(in *s3.PutObjectInput) { in.IfMatch = aws.String(`"00000000000000000000000000000000"`) },
		`If-None-Match: *`:         func(in *s3.PutObjectInput) { in.IfNoneMatch = aws.String("*") },
	} {
		err := put(cond)
		if err == nil {
			return fmt.Errorf("%w: a write to bucket %q with %s on an existing object succeeded; refusing to run the s3 adapter against it", ErrConditionsIgnored, bucket, name)
		}
		if !preconditionFailed(err) {
			return fmt.Errorf("s3: probe bucket %q with %s: %w", bucket, name, err)
		}
	}
	return nil
}

// Result is the JSON object recorded for a publication.
type Result struct {
	Bucket    string `json:"bucket"`
	Key       string `json:"key"`
	ETag      string `json:"etag"`
	VersionID string `json:"version_id,omitempty"`
	Epoch     int64  `json:"epoch"`
	SHA256    string `json:"sha256"`
	Size      int    `json:"size"`
	// FoundBy is how a lookup found it: "object" (its metadata), "receipt"
	// or "version".
	FoundBy string `json:"found_by,omitempty"`
}

// object is what a HEAD tells of the current object.
type object struct {
	exists  bool
	etag    string
	version string
	epoch   int64 // 0: no epoch (not published by the gateway)
	key     string
	sha256  string
}

// Execute publishes req's object once, fenced by its epoch: read the
// object's metadata, refuse (superseded) when it holds a newer epoch, else
// write conditionally on the version read (If-Match its ETag, If-None-Match
// * when there is none) and, when another writer got in between (412),
// read again.
func (a *Adapter) Execute(ctx context.Context, req adapters.Request) (adapters.Outcome, error) {
	p, bucket, err := a.parse(req)
	if err != nil {
		return adapters.Outcome{}, err
	}
	data := p.Data()
	sum := sha256.Sum256(data)
	shaHex := hex.EncodeToString(sum[:])
	for range maxCAS {
		cur, err := a.headAgreed(ctx, bucket, p.Key)
		if err != nil {
			return adapters.Outcome{}, err
		}
		switch {
		case cur.exists && cur.key == req.IdempotencyKey && cur.sha256 == shaHex:
			// Ours already (an earlier attempt's answer was lost).
			return a.succeeded(bucket, p.Key, cur.etag, cur.version, req.Epoch, shaHex, len(data), "")
		case cur.exists && cur.epoch > req.Epoch:
			// The fence: a newer epoch's object is in place. Never
			// overwritten by an older one, however late this comes.
			b, _ := json.Marshal(map[string]any{"superseded_by_epoch": cur.epoch, "rejected_epoch": req.Epoch,
				"fenced_at": "destination", "bucket": bucket, "key": p.Key})
			return adapters.Outcome{Status: outbox.StatusSuperseded, Result: b}, nil
		}
		in := &s3.PutObjectInput{
			Bucket: aws.String(bucket), Key: aws.String(p.Key), Body: bytes.NewReader(data),
			ContentType: aws.String(cmp.Or(p.ContentType, "application/octet-stream")),
			Metadata:    a.metadata(req, p, shaHex),
		}
		// The condition is the version read above: the write lands only
		// if nothing was written since, so the epoch comparison and the
		// write are one atomic step at the destination.
		if cur.exists {
			in.IfMatch = aws.String(cur.etag)
		} else {
			in.IfNoneMatch = aws.String("*")
		}
		if err := req.StillOwner(ctx); err != nil {
			return adapters.Outcome{}, adapters.RetryableError(err)
		}
		out, err := a.client.PutObject(ctx, in, writeOnce)
		if preconditionFailed(err) {
			continue // another writer got in between: read again
		}
		if err != nil {
			return adapters.Outcome{}, classify(fmt.Sprintf("s3: put s3://%s/%s", bucket, p.Key), err)
		}
		res, rerr := a.succeeded(bucket, p.Key, aws.ToString(out.ETag), aws.ToString(out.VersionId), req.Epoch, shaHex, len(data), "")
		a.writeReceipt(ctx, bucket, p.Key, req.IdempotencyKey, res.Result)
		return res, rerr
	}
	return adapters.Outcome{}, adapters.RetryableError(fmt.Errorf("s3: s3://%s/%s: %d conditional writes in a row lost to other writers", bucket, p.Key, maxCAS))
}

// Lookup finds whether req's publication happened: the object's metadata
// names req's key; or its receipt, authenticated, exists (the object was
// replaced by a newer publication since); or, in a versioned bucket, an
// older version names it.
//
// A receipt that is there but not authenticated by a receipt secret
// (written before receipts were signed, or forged by anyone able to write
// the bucket) is no proof that the publication happened — and no proof
// that it did not: the object may have been written. When nothing else
// settles it, the answer is the unknown outcome (Status unknown, found),
// which the runtime records as it is: held for an operator, neither
// succeeded nor executed again. So is a request the configuration no
// longer allows (its bucket left the allow-list since the attempt).
func (a *Adapter) Lookup(ctx context.Context, req adapters.Request) (adapters.Outcome, bool, error) {
	p, bucket, err := a.parse(req)
	if err != nil {
		// The attempt looked up got past these checks: the configuration
		// changed since. The effect may have happened; the destination
		// is no longer one to read.
		return a.held(cmp.Or(p.Bucket, a.cfg.Bucket), p.Key, err.Error()), true, nil
	}
	data := p.Data()
	sum := sha256.Sum256(data)
	shaHex := hex.EncodeToString(sum[:])
	cur, err := a.head(ctx, bucket, p.Key)
	if err != nil {
		return adapters.Outcome{}, false, err
	}
	if cur.exists && cur.key == req.IdempotencyKey && cur.sha256 == shaHex {
		out, err := a.succeeded(bucket, p.Key, cur.etag, cur.version, req.Epoch, shaHex, len(data), "object")
		if err == nil {
			// The attempt whose answer was lost wrote no receipt: write
			// it now, so that a lookup after a newer publication replaced
			// the object still finds this one.
			a.writeReceipt(ctx, bucket, p.Key, req.IdempotencyKey, out.Result)
		}
		return out, err == nil, err
	}
	unproven := false
	got, err := a.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(a.receiptKey(bucket, p.Key, req.IdempotencyKey))})
	switch {
	case err == nil:
		b, rerr := io.ReadAll(io.LimitReader(got.Body, 64<<10))
		_ = got.Body.Close()
		if rerr != nil {
			return adapters.Outcome{}, false, fmt.Errorf("s3: read the receipt: %w", rerr)
		}
		res, ok := a.verifyReceipt(b, bucket, p.Key, req.IdempotencyKey)
		switch {
		case ok && res.SHA256 == shaHex:
			res.FoundBy = "receipt"
			rb, _ := json.Marshal(res)
			return adapters.Outcome{Status: outbox.StatusSucceeded, Result: rb}, true, nil
		case !ok:
			unproven = true
		}
	case !notFound(err):
		return adapters.Outcome{}, false, fmt.Errorf("s3: look up the receipt: %w", err)
	}
	// A versioned bucket keeps the replaced versions: look for ours.
	vs, err := a.client.ListObjectVersions(ctx, &s3.ListObjectVersionsInput{Bucket: aws.String(bucket), Prefix: aws.String(p.Key), MaxKeys: aws.Int32(20)})
	if err == nil {
		for _, v := range vs.Versions {
			if aws.ToString(v.Key) != p.Key || v.VersionId == nil || aws.ToString(v.VersionId) == "null" {
				continue
			}
			h, err := a.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(p.Key), VersionId: v.VersionId})
			if err != nil {
				continue
			}
			if o := fromHead(h.Metadata); o.key == req.IdempotencyKey && o.sha256 == shaHex {
				out, err := a.succeeded(bucket, p.Key, aws.ToString(h.ETag), aws.ToString(v.VersionId), req.Epoch, shaHex, len(data), "version")
				return out, err == nil, err
			}
		}
	}
	if unproven {
		why := "a receipt of this publication exists without a valid MAC (written before receipts were signed, or forged by a bucket writer): it proves nothing, but the object may have been written"
		if len(a.secrets) == 0 {
			why = "a receipt of this publication exists, and receipts cannot be verified without --s3-receipt-secret: it proves nothing, but the object may have been written"
		}
		return a.held(bucket, p.Key, why), true, nil
	}
	return adapters.Outcome{}, false, nil
}

// held is the unknown outcome of a lookup that cannot settle whether the
// publication happened: recorded as it is, held for an operator.
func (a *Adapter) held(bucket, key, why string) adapters.Outcome {
	b, _ := json.Marshal(map[string]string{"bucket": bucket, "key": key, "held": why})
	return adapters.Outcome{Status: outbox.StatusUnknown, Result: b}
}

func (a *Adapter) parse(req adapters.Request) (s3kind.Payload, string, error) {
	p, err := s3kind.Parse(req.Payload)
	if err != nil {
		return p, "", adapters.PermanentError(fmt.Errorf("%w: %v", ErrBadPayload, err))
	}
	if req.IdempotencyKey == "" {
		return p, "", adapters.PermanentError(fmt.Errorf("%w: the intent has no idempotency key", ErrBadPayload))
	}
	bucket := cmp.Or(p.Bucket, a.cfg.Bucket)
	if bucket == "" {
		return p, "", adapters.PermanentError(fmt.Errorf("%w: payload.bucket: no bucket, and the adapter has no default (--s3-bucket)", ErrBadPayload))
	}
	if !a.allowed[bucket] {
		return p, "", adapters.PermanentError(fmt.Errorf("%w: payload.bucket: %q is neither the default bucket (--s3-bucket) nor in --s3-allow; nothing was sent", ErrBucketNotAllowed, bucket))
	}
	return p, bucket, nil
}

func (a *Adapter) metadata(req adapters.Request, p s3kind.Payload, shaHex string) map[string]string {
	m := make(map[string]string, len(p.Metadata)+5)
	for k, v := range p.Metadata {
		m[k] = v
	}
	m[MetaEpoch] = strconv.FormatInt(req.Epoch, 10)
	m[MetaResource] = url.QueryEscape(req.Resource)
	m[MetaIntentID] = strconv.FormatInt(req.IntentID, 10)
	m[MetaKey] = url.QueryEscape(req.IdempotencyKey)
	m[MetaSHA256] = shaHex
	return m
}

// head reads the object's metadata; not found is exists=false.
func (a *Adapter) head(ctx context.Context, bucket, key string) (object, error) {
	h, err := a.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if notFound(err) {
		return object{}, nil
	}
	if err != nil {
		// Nothing was written: a read that failed is never an effect.
		return object{}, retryOrFail(fmt.Sprintf("s3: head s3://%s/%s", bucket, key), err)
	}
	o := fromHead(h.Metadata)
	o.exists, o.etag, o.version = true, aws.ToString(h.ETag), aws.ToString(h.VersionId)
	return o, nil
}

// headAgreed is head, trusted only once two reads in a row agree. The
// fence below compares the epoch of one read and writes on the ETag of the
// same read, so the two must belong to one object. A HEAD is not always
// one snapshot on S3-compatible servers: versitygw reads the user metadata
// and then the ETag, each by path, so a publication renamed into place
// between the two reads answers the old object's epoch with the new
// object's ETag, and a write conditional on that ETag would replace a
// newer epoch's object with an older one (TestTornHeadDoesNotLetAnOlderEpochWin).
// A torn read means a write landed during it; a read that began after it
// ended no longer sees the old metadata, so it differs. Reads that keep
// differing (writers one after another) are a retryable error.
func (a *Adapter) headAgreed(ctx context.Context, bucket, key string) (object, error) {
	prev, err := a.head(ctx, bucket, key)
	if err != nil {
		return object{}, err
	}
	for range maxCAS {
		cur, err := a.head(ctx, bucket, key)
		if err != nil {
			return object{}, err
		}
		if cur == prev {
			return cur, nil
		}
		prev = cur
	}
	return object{}, adapters.RetryableError(fmt.Errorf("s3: head s3://%s/%s: %d reads in a row disagreed (writers in between)", bucket, key, maxCAS+1))
}

func fromHead(md map[string]string) object {
	var o object
	o.epoch, _ = strconv.ParseInt(md[MetaEpoch], 10, 64)
	o.key, _ = url.QueryUnescape(md[MetaKey])
	o.sha256 = md[MetaSHA256]
	return o
}

func (a *Adapter) succeeded(bucket, key, etag, version string, epoch int64, shaHex string, size int, foundBy string) (adapters.Outcome, error) {
	b, err := json.Marshal(Result{Bucket: bucket, Key: key, ETag: etag, VersionID: version, Epoch: epoch, SHA256: shaHex, Size: size, FoundBy: foundBy})
	if err != nil {
		return adapters.Outcome{}, err
	}
	return adapters.Outcome{Status: outbox.StatusSucceeded, Result: b}, nil
}

// receiptKey is where the receipt of key's publication under idemKey is:
// ReceiptPrefix + sha256(bucket/key) + "/" + sha256(idempotency key).
func (a *Adapter) receiptKey(bucket, key, idemKey string) string {
	o := sha256.Sum256([]byte(bucket + "/" + key))
	k := sha256.Sum256([]byte(idemKey))
	return a.cfg.ReceiptPrefix + hex.EncodeToString(o[:]) + "/" + hex.EncodeToString(k[:])
}

// receiptVersion is the format of the receipts written: signedReceipt.
const receiptVersion = 2

// signedReceipt is a receipt's content: the publication's result and an
// HMAC-SHA256 over it, its bucket, key and idempotency key (receiptMAC),
// so that a receipt copied to another publication's place proves nothing
// either.
type signedReceipt struct {
	V      int             `json:"v"`
	Result json.RawMessage `json:"result"`
	MAC    string          `json:"mac"`
}

// receiptMAC is the MAC of a receipt under secret: every field
// length-prefixed, so that no two field lists share an input.
func receiptMAC(secret []byte, bucket, key, idemKey string, result []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("fencegate s3 receipt v2"))
	for _, f := range [][]byte{[]byte(bucket), []byte(key), []byte(idemKey), result} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(f))))
		h.Write(f)
	}
	return h.Sum(nil)
}

// verifyReceipt returns the result a receipt holds when one of the
// secrets authenticates it for this bucket, key and idempotency key.
func (a *Adapter) verifyReceipt(b []byte, bucket, key, idemKey string) (Result, bool) {
	var r signedReceipt
	var res Result
	if json.Unmarshal(b, &r) != nil || r.V != receiptVersion || len(r.Result) == 0 {
		return res, false
	}
	mac, err := hex.DecodeString(r.MAC)
	if err != nil {
		return res, false
	}
	for _, secret := range a.secrets {
		if hmac.Equal(mac, receiptMAC(secret, bucket, key, idemKey, r.Result)) {
			return res, json.Unmarshal(r.Result, &res) == nil
		}
	}
	return res, false
}

// writeReceipt records, after the object was published, that it was: a
// lookup after a newer publication replaced the object finds it here.
// Best effort (the object's own metadata answers until it is replaced); a
// crash between the publication and the receipt leaves that window.
// Without a receipt secret none is written: an unsigned one would prove
// nothing.
func (a *Adapter) writeReceipt(ctx context.Context, bucket, key, idemKey string, result json.RawMessage) {
	if len(a.secrets) == 0 {
		return
	}
	// The MAC covers the result as the receipt will hold it (encoding
	// may compact or escape what it was given): encoded once, read back,
	// signed.
	var r signedReceipt
	b, err := json.Marshal(signedReceipt{V: receiptVersion, Result: result})
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	var body []byte
	if err == nil {
		r.MAC = hex.EncodeToString(receiptMAC(a.secrets[0], bucket, key, idemKey, r.Result))
		body, err = json.Marshal(r)
	}
	if err != nil {
		a.log.Warn("s3: could not encode the publication's receipt", "bucket", bucket, "key", key, "error", err)
		return
	}
	rk := a.receiptKey(bucket, key, idemKey)
	put := func(cond func(*s3.PutObjectInput)) error {
		in := &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(rk), Body: bytes.NewReader(body), ContentType: aws.String("application/json")}
		cond(in)
		_, err := a.client.PutObject(ctx, in, writeOnce)
		return err
	}
	// A receipt is written once.
	err = put(func(in *s3.PutObjectInput) { in.IfNoneMatch = aws.String("*") })
	if preconditionFailed(err) {
		// One is there: this publication's, or one that proves nothing
		// (unsigned, from before receipts were signed, or forged) and
		// would stand in the way of the proof. Replace the latter only,
		// and only if it is still the one read.
		got, gerr := a.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(rk)})
		if gerr != nil {
			err = gerr
		} else {
			b, rerr := io.ReadAll(io.LimitReader(got.Body, 64<<10))
			_ = got.Body.Close()
			err = rerr
			if _, ok := a.verifyReceipt(b, bucket, key, idemKey); rerr == nil && !ok {
				err = put(func(in *s3.PutObjectInput) { in.IfMatch = got.ETag })
				if err == nil {
					a.log.Info("s3: replaced an unauthenticated receipt with this publication's", "bucket", bucket, "key", key)
				}
			}
		}
	}
	if err != nil && !preconditionFailed(err) {
		a.log.Warn("s3: could not write the publication's receipt; a lookup after a newer publication replaced the object will not find it",
			"bucket", bucket, "key", key, "error", err)
	}
}

// classify says what a failed PUT means: an answer from the server
// refusing it (a 4xx) is permanent; throttling (503 SlowDown, 429) or a
// request timeout (408) retryable: nothing was stored; no connection is
// retryable; anything else is unknown, settled by Lookup: a timeout or a
// reset after the body was sent, and any other 5xx (500 InternalError, a
// proxy's 502 or 504), which comes after the whole object arrived and
// may come after it was stored. Retried instead, the intent was recorded
// failed, effect none, when its last attempt met one over an object in
// place, and superseded when a newer publication replaced the object
// before the retry read it; the lookup finds it by its metadata (or its
// receipt, or an older version).
func classify(what string, err error) error {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		code := re.HTTPStatusCode()
		switch {
		case code == 503 || code == 429 || code == 408:
			// Back-pressure: honoured as every adapter does (AWS sends no
			// Retry-After on SlowDown; compatible servers and proxies may).
			var after time.Duration
			if re.Response != nil {
				after = adapters.RetryAfter(re.Response.Header.Get("Retry-After"), time.Now())
			}
			return adapters.RetryableAfter(fmt.Errorf("%s: %w", what, err), after)
		case code == 501:
			// NotImplemented: the server does not do what a header asked
			// (a conditional write it lacks): nothing was stored, and a
			// retry will not do better.
			return adapters.PermanentError(fmt.Errorf("%s: %w", what, err))
		case code >= 500:
			return adapters.UnknownError(fmt.Errorf("%s: the server failed after the object arrived, and may have stored it: %w", what, err))
		case code >= 400:
			return adapters.PermanentError(fmt.Errorf("%s: %w", what, err))
		}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return adapters.RetryableError(fmt.Errorf("%s: not sent: %w", what, err))
	}
	return adapters.UnknownError(fmt.Errorf("%s: %w", what, err))
}

// retryOrFail classifies a failed read: access and bucket errors are
// permanent, everything else retryable (a read has no effect). A
// permanent one ends an Execute failed and holds a Lookup's intent for an
// operator, so the 4xx that pass with time (expired credentials about to
// be renewed, a clock off) are retryable.
func retryOrFail(what string, err error) error {
	var re *smithyhttp.ResponseError
	var ae smithy.APIError
	transient := errors.As(err, &ae) && transientCodes[ae.ErrorCode()]
	if errors.As(err, &re) && re.HTTPStatusCode() >= 400 && re.HTTPStatusCode() < 500 && re.HTTPStatusCode() != 429 && re.HTTPStatusCode() != 408 && !transient {
		return adapters.PermanentError(fmt.Errorf("%s: %w", what, err))
	}
	return adapters.RetryableError(fmt.Errorf("%s: %w", what, err))
}

// transientCodes are S3 error codes of a 4xx that a later request may not
// meet: credentials that expired (and are renewed), a request signed
// with a clock the server finds off, a request the server timed out.
var transientCodes = map[string]bool{
	"ExpiredToken": true, "TokenRefreshRequired": true, "RequestTimeTooSkewed": true,
	"RequestExpired": true, "RequestTimeout": true, "SlowDown": true,
}

func httpStatus(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// preconditionFailed: 412 (the condition was false), or 409
// ConditionalRequestConflict (a concurrent conditional write won).
func preconditionFailed(err error) bool {
	if err == nil {
		return false
	}
	if s := httpStatus(err); s == 412 {
		return true
	}
	var ae smithy.APIError
	return errors.As(err, &ae) && (ae.ErrorCode() == "PreconditionFailed" || ae.ErrorCode() == "ConditionalRequestConflict")
}

func notFound(err error) bool {
	if err == nil {
		return false
	}
	if httpStatus(err) == 404 {
		return true
	}
	var ae smithy.APIError
	return errors.As(err, &ae) && (ae.ErrorCode() == "NotFound" || ae.ErrorCode() == "NoSuchKey")
}
