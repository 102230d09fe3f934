package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fencegate/fencegate/cli/internal/bench"
)

// cmdBench runs the benchmarks next to their raw baselines (gateway bench).
//
// Flags: --case NAMES (cases or the group e2e, comma-separated, or all:
// the default); --duration D per measurement (default 5s); --drain-intents
// N, e2e-drain's backlog (default 50,000); --file-dir DIR, where file-drain
// writes (default a temporary directory); --json prints one JSON object
// instead of a table; --database-url and --nats-url use running servers instead of the
// throwaway ones it starts (a durable PostgreSQL cluster, fsync on, and an
// embedded JetStream server). On a given server it works in a database of
// its own, created and dropped by it. --cpuprofile FILE writes a Go CPU
// profile of the cases. --river-peer BIN runs River's side of e2e-drain's
// budget with that riverwork binary (cli/internal/bench/riverwork). Progress
// goes to stderr.
//
// The cases themselves are cli/internal/bench's; this parses the flags into a
// bench.Config and prints the report.
func cmdBench(ctx context.Context, a *app, args []string) int {
	fs, _ := a.newFlags("bench")
	var (
		caseName = fs.String("case", "all", "cases to run, comma-separated: "+strings.Join(bench.Cases(), ", ")+"; e2e (e2e-latency, e2e-drain, growth); or all")
		duration = fs.Duration("duration", 5*time.Second, "length of each measurement")
		drainN   = fs.Int("drain-intents", bench.DefaultDrainIntents, "committed intents in e2e-drain's backlog")
		fileDir  = fs.String("file-dir", "", "directory file-drain publishes in, on the disk to measure (default: a new temporary directory)")
		asJSON   = fs.Bool("json", false, "print one JSON object instead of a table")
		natsURL  = fs.String("nats-url", "", "NATS URL (default: an embedded JetStream server)")
		cpuProf  = fs.String("cpuprofile", "", "write a Go CPU profile of the cases to this file")
		riverBin = fs.String("river-peer", "", "River's peer for e2e-drain's budget: a riverwork binary (built from cli/internal/bench/riverwork), run on the same server after the drain")
	)
	// Unlike other commands, the database is never taken from the
	// environment: a benchmark writes a million rows, so it runs on a
	// throwaway cluster unless told otherwise.
	dbFlag := fs.Lookup("database-url")
	dbFlag.DefValue, _ = "", dbFlag.Value.Set("")
	dbFlag.Usage = "PostgreSQL URL of a running server to measure on (default: a throwaway cluster; $GATEWAY_DATABASE_URL is not read)"
	if code, ok := a.parseOnly(fs, args); !ok {
		return code
	}
	cases, err := bench.SelectCases(*caseName)
	if err != nil {
		return a.fail(err)
	}

	// Start checks the other flags before it starts anything.
	b, err := bench.Start(ctx, bench.Config{
		Cases: cases, Duration: *duration, DrainIntents: *drainN, FileDir: *fileDir,
		DatabaseURL: dbFlag.Value.String(), NATSURL: *natsURL, CPUProfile: *cpuProf, Schema: a.schema(), RiverPeer: *riverBin,
		Log: a.stderr, Connect: a.connect, RunGateway: a.benchRun, StopTimeout: stopTimeout,
	})
	if err != nil {
		return a.fail(err)
	}
	// Closed after the report is printed: the benchmark's database is
	// dropped and its servers stopped last.
	defer b.Close()
	rep, err := b.Run(ctx)
	if err != nil {
		return a.fail(err)
	}

	if *asJSON {
		a.writeJSON(map[string]any{"cases": rep.Cases, "machine": rep.Machine, "duration": rep.Duration.String()})
		return exitOK
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tunit\tvalue\tbaseline\tratio\tgoal\tmet\t")
	for _, r := range rep.Cases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t%s\t%v\t\n", r.Name, r.Unit, fmtNum(r.Value), fmtNum(r.Baseline), r.Ratio, r.Goal, r.Met)
	}
	_ = tw.Flush()
	for _, r := range rep.Cases {
		if r.Budget != nil {
			printBudget(a.stdout, r)
		}
	}
	keys := make([]string, 0, len(rep.Machine))
	for k := range rep.Machine {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(a.stdout, "%s: %v\n", k, rep.Machine[k])
	}
	return exitOK
}

// benchRun is bench.Config.RunGateway: `gateway run` in the bench's
// process, through cmdRun itself, with the bench's hooks.
func (a *app) benchRun(ctx context.Context, args []string, out io.Writer, hooks bench.RunHooks) int {
	// No environment: the bench's own variables (a database URL, tokens)
	// must not reach it; everything it uses is in args.
	inner := &app{stdout: out, stderr: out, getenv: func(string) string { return "" }, runHooks: &hooks}
	return cmdRun(ctx, inner, args)
}

// printBudget prints a case's budget per unit, River's beside it when it
// ran.
func printBudget(w io.Writer, r bench.Result) {
	var river *bench.Budget
	head := fmt.Sprintf("\n%s budget per settled intent (%d intents, %.1fs)", r.Name, r.Budget.Units, r.Budget.Seconds)
	if r.River != nil {
		river = r.River.Budget
		head += fmt.Sprintf(" vs River per worked job (%d jobs, %.1fs, %.0f jobs/s)", river.Units, river.Seconds, r.River.Rate)
	}
	fmt.Fprintln(w, head+":")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\tfencegate\t")
	if river != nil {
		fmt.Fprint(tw, "River\t")
	}
	fmt.Fprintln(tw)
	row := func(name string, get func(*bench.Budget) string) {
		fmt.Fprintf(tw, "%s\t%s\t", name, get(r.Budget))
		if river != nil {
			fmt.Fprintf(tw, "%s\t", get(river))
		}
		fmt.Fprintln(tw)
	}
	opt := func(v *float64) string {
		if v == nil {
			return "absent"
		}
		return strconv.FormatFloat(*v, 'f', 2, 64)
	}
	row("PostgreSQL CPU µs", func(b *bench.Budget) string { return opt(b.PGCPUUs) })
	row("client CPU µs", func(b *bench.Budget) string { return opt(b.GatewayCPUUs) })
	row("statements", func(b *bench.Budget) string { return opt(b.Statements) })
	row("round trips", func(b *bench.Budget) string { return opt(b.RoundTrips) })
	row("WAL bytes", func(b *bench.Budget) string { return strconv.FormatFloat(b.WALBytes, 'f', 0, 64) })
	row("row versions", func(b *bench.Budget) string { return strconv.FormatFloat(b.RowVersions, 'f', 2, 64) })
	tables := map[string]bool{}
	for _, b := range []*bench.Budget{r.Budget, river} {
		if b != nil {
			for t := range b.Tables {
				tables[t] = true
			}
		}
	}
	for _, t := range slices.Sorted(maps.Keys(tables)) {
		row("  "+t+" ins/upd (HOT)", func(b *bench.Budget) string {
			tw, ok := b.Tables[t]
			if !ok {
				return "-"
			}
			return fmt.Sprintf("%.2f/%.2f (%.0f%%)", tw.Inserted, tw.Updated, 100*tw.HOTShare)
		})
	}
	_ = tw.Flush()
	for _, b := range []*bench.Budget{r.Budget, river} {
		if b == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(b.Absent)) {
			fmt.Fprintf(w, "absent (%s): %s: %s\n", b.Unit, k, b.Absent[k])
		}
	}
}

func fmtNum(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}
