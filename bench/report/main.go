// Command report turns the raw results of `make bench` (scripts/bench.sh)
// into bench/REPORT.md and its plots (PNG, gonum.org/v1/plot): tables of
// medians and percentiles, A/B ratios against the reference plugins, and
// every target of issue 8 marked met or not met with the measured gap.
// It is its own Go module so that the plotting dependencies stay out of
// podnet's go.mod.
//
//	go run -C bench/report . -in ../results -out ../REPORT.md -plots ../plots
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	podnetStack = "podnet+podnet-ipam"
	// reconcileStack is podnetStack while podnet-routed's leak reconcile
	// runs (issue 22).
	reconcileStack = "podnet+podnet-ipam+reconcile"
	bridgeStack    = "podnet-bridge+podnet-ipam"
	ptpStack       = "ptp+host-local"
	refBrStack     = "bridge+host-local"
	seqMode        = "sequential"
	concMode       = "concurrent"
)

// target is one goal of issue 8 and how this run fared.
type target struct {
	Goal, Measured, Status, Gap string
}

func met(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**not met**"
}

type report struct {
	b       strings.Builder
	targets []target
	outDir  string
	plots   string
	notes   []string
	// attachAB is scripts/bench-attach-ab.sh's table (attach-ab.md in
	// the results), put after the policy stage's attach table
	attachAB string
	// cniAB is scripts/bench-cni-ab.sh's table (cni-ab.md), put after
	// the CNI section's ratios
	cniAB string
}

func (r *report) f(format string, args ...any) { fmt.Fprintf(&r.b, format, args...) }

func (r *report) rel(path string) string {
	p, err := filepath.Rel(r.outDir, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(p)
}

func main() {
	in := flag.String("in", "bench/results", "directory of cni.json, reconcile.json, routed.json, datapath.json, policy.json, meta.json and ipam.md")
	out := flag.String("out", "bench/REPORT.md", "report to write")
	plots := flag.String("plots", "bench/plots", "directory for the PNG plots")
	flag.Parse()
	if err := os.MkdirAll(*plots, 0o755); err != nil {
		fatal(err)
	}
	absOut, _ := filepath.Abs(*out)
	absPlots, _ := filepath.Abs(*plots)
	absIn, _ := filepath.Abs(*in)
	r := &report{outDir: filepath.Dir(absOut), plots: absPlots}

	var meta metaData
	metaErr := load(*in, "meta.json", &meta)
	var cni cniData
	cniErr := load(*in, "cni.json", &cni)
	var routed routedData
	routedErr := load(*in, "routed.json", &routed)
	var dp datapathData
	dpErr := load(*in, "datapath.json", &dp)
	var rec reconcileData
	recErr := load(*in, "reconcile.json", &rec)
	var pol policyData
	polErr := load(*in, "policy.json", &pol)

	var body report
	body.outDir, body.plots = r.outDir, r.plots
	if ab, err := os.ReadFile(filepath.Join(absIn, "attach-ab.md")); err == nil {
		body.attachAB = strings.TrimSpace(string(ab))
	}
	if ab, err := os.ReadFile(filepath.Join(absIn, "cni-ab.md")); err == nil {
		body.cniAB = strings.TrimSpace(string(ab))
	}
	if cniErr == nil {
		body.cniSection(&cni)
		var before stepsBefore
		beforeErr := load(*in, "steps-before.json", &before)
		body.stepSection(&cni, &before, beforeErr)
		body.reconcileSection(&cni, &rec, recErr)
		body.occupancySection(&cni)
	} else {
		body.f("## 1. Plugins: ADD/DEL\n\nNo results (%v).\n\n", cniErr)
	}
	ipamMD := filepath.Join(absIn, "ipam.md")
	body.ipamSection(ipamMD)
	if cniErr == nil {
		body.floorSection(&cni)
	}
	if routedErr == nil {
		body.routedSection(&routed)
	} else {
		body.f("## 5. podnet-routed\n\nNo results (%v).\n\n", routedErr)
	}
	if dpErr == nil {
		body.datapathSection(&dp)
	} else {
		body.f("## 6. Data path\n\nNo results (%v).\n\n", dpErr)
	}
	body.policySection(&pol, polErr)

	r.header(&meta, metaErr, absIn)
	r.targetSection(body.targets)
	r.b.WriteString(body.b.String())
	if len(body.notes) > 0 {
		r.f("## Observations\n\n")
		for _, n := range body.notes {
			r.f("- %s\n", n)
		}
		r.f("\n")
	}
	r.f("## Raw data\n\n")
	r.f("The raw samples are in [`%s`](%s) (`cni.json`, `reconcile.json`, `routed.json`, `datapath.json`, `policy.json`, `meta.json`); ", r.rel(absIn), r.rel(absIn))
	r.f("`go run -C bench/report . -in ../results -out ../REPORT.md -plots ../plots` rebuilds this report and the plots from them.\n")
	if err := os.WriteFile(*out, []byte(r.b.String()), 0o644); err != nil {
		fatal(err)
	}
	fmt.Fprintf(os.Stderr, "report: wrote %s\n", *out)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "report:", err)
	os.Exit(1)
}

func (r *report) header(m *metaData, err error, in string) {
	r.f("# podnet benchmark report\n\n")
	r.f("podnet against the reference plugins (containernetworking/plugins %s) on one machine, in one invocation. ", orDash(m.CNIPlugins))
	r.f("The machine is shared and noisy, so the configurations take turns (the order rotates every repetition) and the report gives medians and A/B ratios; a lone absolute time means little here. ")
	r.f("Issue 8 has the plugin workloads and targets, issue 14 the podnet-routed ones.\n\n")
	if err != nil {
		r.f("(meta.json missing: %v)\n\n", err)
		return
	}
	r.f("| | |\n|---|---|\n")
	r.f("| command | `%s` (scripts/bench.sh), total wall time %s |\n", m.Command, m.wallTime())
	r.f("| date | %s |\n", m.Date)
	r.f("| commit | %s |\n", m.Commit)
	r.f("| machine | %s, %d CPUs, %.0f GiB RAM |\n", m.CPU, m.Nproc, m.MemGiB)
	r.f("| kernel | %s |\n", m.Kernel)
	r.f("| go | %s |\n", m.Go)
	r.f("| reference plugins | containernetworking/plugins %s (ptp, bridge, host-local; `%s`) |\n", m.CNIPlugins, m.CNITools)
	r.f("| Kubernetes | kube-apiserver %s, etcd %s (test/kapi, on loopback) |\n", m.KubeAPI, m.Etcd)
	r.f("| iperf3 | %s |\n", m.Iperf)
	r.f("| load average (1/5/15 min) | %s before, %s after |\n\n", m.LoadBefore, m.LoadAfter)
	if len(m.Stages) > 0 {
		r.f("Stages: ")
		var parts []string
		for _, s := range m.Stages {
			st := ""
			if s.Status != "ok" {
				st = " — " + s.Status
			}
			parts = append(parts, fmt.Sprintf("%s %.0f s%s", s.Name, s.Seconds, st))
		}
		r.f("%s.\n\n", strings.Join(parts, ", "))
	}
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func (r *report) targetSection(ts []target) {
	r.f("## Targets\n\n")
	r.f("Goals from issues 8, 14, 22, 24, 33 and 34, not assertions. Ratios are podnet ÷ reference, the median over the repetitions (each repetition's runs were back to back).\n\n")
	r.f("| target | measured | | gap |\n|---|---|---|---|\n")
	nMet := 0
	for _, t := range ts {
		if strings.Contains(t.Status, "**met**") {
			nMet++
		}
		r.f("| %s | %s | %s | %s |\n", t.Goal, t.Measured, t.Status, t.Gap)
	}
	r.f("\n%d of %d targets met.\n\n", nMet, len(ts))
}

// gapRatio describes how far a measured ratio is from a "≤ want" goal.
func gapRatio(got, want float64) string {
	if math.IsNaN(got) {
		return "no data"
	}
	if got <= want {
		return fmt.Sprintf("%.0f %% below the limit", (1-got/want)*100)
	}
	return fmt.Sprintf("%.2f× over the limit (%.2f× vs ≤ %.2f×)", got/want, got, want)
}

// wallTime is how long the run took: from its start to the writing of
// meta.json, else (an older meta.json) the sum of its stages; never the
// time since it started, which a report written again later would take.
func (m *metaData) wallTime() string {
	if m.StartedUnix > 0 && m.EndedUnix >= m.StartedUnix {
		return (time.Duration(m.EndedUnix-m.StartedUnix) * time.Second).String()
	}
	var s float64
	for _, st := range m.Stages {
		s += st.Seconds
	}
	if s == 0 {
		return "—"
	}
	return fmt.Sprintf("%s (the stages' sum)", (time.Duration(s) * time.Second).String())
}
