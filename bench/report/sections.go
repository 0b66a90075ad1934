package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
)

var stackOrder = []string{podnetStack, bridgeStack, ptpStack, refBrStack}

func (r *report) cniSection(c *cniData) {
	cells := aggregate(c.Runs)
	reps, pods, workers := 0, 0, 0
	for _, run := range c.Runs {
		reps = max(reps, run.Rep)
		pods = max(pods, run.Pods)
		if run.Mode == concMode {
			workers = run.Workers
		}
	}
	r.f("## 1. Plugins: %d pods ADD then DEL, sequential and %d concurrent\n\n", pods, workers)
	r.f("Each run ADDs %d pods (each in its own netns) through libcni, then DELs them, with the plugins exec'd inside a node netns as a container runtime does; ", pods)
	r.f("latency is libcni's whole `AddNetworkList`/`DelNetworkList` (what the runtime waits for). ")
	r.f("%d repetitions; in each, every stack runs sequentially and with %d workers, one stack after the other (order rotated per repetition). ", reps, workers)
	r.f("CPU per verb is the `RUSAGE_CHILDREN` delta of the phase (plugin processes plus the IPAM processes they reap) divided by the verbs; podnet and podnet-bridge run podnet-ipam in-process (their default), the reference plugins exec host-local. ")
	r.f("IPAM data dirs on %s. After every run the leak check compares the node netns with its state before the run (links, routes, permanent neighbors), requires every pod netns to hold only `lo`, and looks for reservation files; `test/bench/cnibench/leak_test.go` (run by `make test`) shows it failing on injected leaks.\n\n", c.DataFS)

	for _, mode := range []string{seqMode, concMode} {
		label := "sequential"
		if mode == concMode {
			label = fmt.Sprintf("%d concurrent", workers)
		}
		r.f("**%s** (ms; pooled over the repetitions; CPU = ms of CPU per verb)\n\n", label)
		r.f("| stack | ADD p50 | p90 | p99 | max | CPU/ADD | DEL p50 | p90 | p99 | max | CPU/DEL | ADD/s | leaks | errors |\n")
		r.f("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
		for _, s := range stackOrder {
			ce := cells[[2]string{s, mode}]
			if ce == nil {
				continue
			}
			leaks, errs := leakSummary(c.Runs, s, mode)
			r.f("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %s | %d |\n", s,
				fmtMs(ce.add.p(50)), fmtMs(ce.add.p(90)), fmtMs(ce.add.p(99)), fmtMs(ce.add.p(100)), fmtMs(ce.add.cpu()),
				fmtMs(ce.del.p(50)), fmtMs(ce.del.p(90)), fmtMs(ce.del.p(99)), fmtMs(ce.del.p(100)), fmtMs(ce.del.cpu()),
				float64(ce.add.N)/ce.add.Wall, leaks, errs)
		}
		r.f("\n")
	}

	r.f("Ratios, podnet ÷ reference (median of the per-repetition ratios, range in brackets; below 1 means podnet is faster or cheaper):\n\n")
	r.f("| pair | mode | ADD p50 | CPU/ADD | DEL p50 | CPU/DEL |\n|---|---|---:|---:|---:|---:|\n")
	type pr struct{ a, b string }
	for _, p := range []pr{{podnetStack, ptpStack}, {bridgeStack, refBrStack}, {bridgeStack, ptpStack}} {
		for _, mode := range []string{seqMode, concMode} {
			a, b := cells[[2]string{p.a, mode}], cells[[2]string{p.b, mode}]
			if a == nil || b == nil {
				continue
			}
			r.f("| %s ÷ %s | %s | %s | %s | %s | %s |\n", p.a, p.b, mode,
				repRatio(a.add.RepP50, b.add.RepP50), repRatio(a.add.CPU, b.add.CPU),
				repRatio(a.del.RepP50, b.del.RepP50), repRatio(a.del.CPU, b.del.CPU))
		}
	}
	r.f("\n")
	r.teardownTable(c.Runs)
	if path, err := plotCNI(r.plots, cells, workers); err == nil {
		r.f("![ADD and DEL latency distribution per stack](%s)\n\n", r.rel(path))
	} else {
		r.f("(plot failed: %v)\n\n", err)
	}

	// Targets: podnet against ptp, podnet-bridge against bridge, each
	// with host-local.
	for _, pair := range [][2]string{{podnetStack, ptpStack}, {bridgeStack, refBrStack}} {
		for _, mode := range []string{seqMode, concMode} {
			a, b := cells[[2]string{pair[0], mode}], cells[[2]string{pair[1], mode}]
			if a == nil || b == nil {
				continue
			}
			add := repRatio(a.add.RepP50, b.add.RepP50)
			cpu := repRatio(a.add.CPU, b.add.CPU)
			del := repRatio(a.del.RepP50, b.del.RepP50)
			who := pair[0] + " ÷ " + pair[1]
			r.targets = append(r.targets,
				target{fmt.Sprintf("ADD p50 ≤ 0.5×, %s, %s", who, mode), fmt.Sprintf("%.2f× (%s vs %s ms)", add.Med, fmtMs(a.add.p(50)), fmtMs(b.add.p(50))), met(add.Med <= 0.5), gapRatio(add.Med, 0.5)},
				target{fmt.Sprintf("CPU per ADD ≤ 0.5×, %s, %s", who, mode), fmt.Sprintf("%.2f× (%s vs %s ms)", cpu.Med, fmtMs(a.add.cpu()), fmtMs(b.add.cpu())), met(cpu.Med <= 0.5), gapRatio(cpu.Med, 0.5)},
				target{fmt.Sprintf("DEL p50 ≤ 0.7×, %s, %s", who, mode), fmt.Sprintf("%.2f× (%s vs %s ms)", del.Med, fmtMs(a.del.p(50)), fmtMs(b.del.p(50))), met(del.Med <= 0.7), gapRatio(del.Med, 0.7)},
			)
		}
	}
	leaks := 0
	for _, run := range c.Runs {
		if run.Leak != "" {
			leaks++
		}
	}
	for _, o := range c.Occupancy {
		if o.Leak != "" {
			leaks++
		}
	}
	r.targets = append(r.targets, target{"zero leaks after every run", fmt.Sprintf("%d of %d runs leaked", leaks, len(c.Runs)+len(c.Occupancy)), met(leaks == 0), map[bool]string{true: "—", false: "see the leak columns"}[leaks == 0]})
}

func leakSummary(runs []cniRun, stack, mode string) (string, int) {
	leaks, errs, n := 0, 0, 0
	first := ""
	for _, r := range runs {
		if r.Stack != stack || r.Mode != mode {
			continue
		}
		n++
		errs += len(r.Errors)
		if r.Leak != "" {
			leaks++
			if first == "" {
				first = r.Leak
			}
		}
	}
	if leaks == 0 {
		return fmt.Sprintf("0 of %d runs", n), errs
	}
	return fmt.Sprintf("%d of %d runs: %s", leaks, n, mdEscape(first)), errs
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func (r *report) occupancySection(c *cniData) {
	if len(c.Occupancy) == 0 {
		return
	}
	n, chunk := c.Occupancy[0].Pods, c.Occupancy[0].Chunk
	k := min(100, n)
	r.f("## 2. %d pods on one node\n\n", n)
	r.f("One node netns per stack; pods are added one at a time, the two stacks taking turns every %d pods, until each node holds %d, then deleted the same way. ", chunk, n)
	r.f("Flatness is the ADD p50 of the last %d pods over that of the first %d.\n\n", k, k)
	r.f("| stack | ADD p50, pods 1–%d | ADD p50, pods %d–%d | last ÷ first | DEL p50, first %d deleted | last %d deleted | CPU/ADD | leaks | errors |\n", k, n-k+1, n, k, k)
	r.f("|---|---:|---:|---:|---:|---:|---:|---|---:|\n")
	ratios := map[string]float64{}
	for _, o := range c.Occupancy {
		first, last := median(o.AddMs[:k]), median(o.AddMs[n-k:])
		ratios[o.Stack] = last / first
		leak := "none"
		if o.Leak != "" {
			leak = mdEscape(o.Leak)
		}
		r.f("| %s | %s | %s | %.2f× | %s | %s | %s | %s | %d |\n", o.Stack, fmtMs(first), fmtMs(last), last/first,
			fmtMs(median(o.DelMs[:k])), fmtMs(median(o.DelMs[n-k:])), fmtMs((o.AddUserMs+o.AddSysMs)/float64(n)), leak, len(o.Errors))
	}
	r.f("\n")
	if path, err := plotOccupancy(r.plots, c.Occupancy); err == nil {
		r.f("![ADD latency against the number of pods on the node](%s)\n\n", r.rel(path))
	} else {
		r.f("(plot failed: %v)\n\n", err)
	}
	if v, ok := ratios[podnetStack]; ok {
		ref := ""
		if rv, ok := ratios[ptpStack]; ok {
			ref = fmt.Sprintf("; ptp+host-local %.2f×", rv)
		}
		gap := fmt.Sprintf("%.0f %% growth", (v-1)*100)
		if v > 1.10 {
			gap = fmt.Sprintf("%.0f %% growth, %.0f points over", (v-1)*100, (v-1.10)*100)
		}
		r.targets = append(r.targets, target{fmt.Sprintf("ADD p50 of pods %d–%d within 10 %% of pods 1–%d", n-k+1, n, k), fmt.Sprintf("%.2f×%s", v, ref), met(v <= 1.10), gap})
	}
}

func (r *report) ipamSection(path string) {
	r.f("## 3. IPAM alone: podnet-ipam vs host-local\n\n")
	data, err := os.ReadFile(path)
	if err != nil {
		r.f("Not run (%v).\n\n", err)
		return
	}
	r.f("Written in the same run by scripts/bench-ipam.sh: [%s](%s) (exec'd binaries side by side, sequential, at 0 to 99 %% occupancy of a /16, plus the in-process Go benchmark). Its ratio table (host-local time ÷ podnet-ipam time, above 1 means podnet-ipam is faster):\n\n", r.rel(path), r.rel(path))
	// Copy the first ratio table of ipam.md.
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	in := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "| pre-reserved | ADD | DEL") {
			in = true
		}
		if in {
			if !strings.HasPrefix(line, "|") {
				break
			}
			r.f("%s\n", line)
		}
	}
	r.f("\n")
}

func (r *report) floorSection(c *cniData) {
	r.f("## 4. Floors\n\n")
	r.f("What any exec-invoked plugin pays, measured in the same run (interleaved with the repetitions above), so the plugin numbers can be read against the physical limit:\n\n")
	r.f("| floor | n | p50 ms | p90 ms | CPU p50 ms | what |\n|---|---:|---:|---:|---:|---|\n")
	byName := map[string]floorRun{}
	for _, f := range c.Floors {
		byName[f.Name] = f
		cpu := "—"
		if len(f.CPUMs) > 0 {
			cpu = fmtMs(median(f.CPUMs))
		}
		r.f("| %s | %d | %s | %s | %s | %s |\n", f.Name, len(f.Ms), fmtMs(median(f.Ms)), fmtMs(pct(f.Ms, 90)), cpu, f.Note)
	}
	r.f("\n")
	cells := aggregate(c.Runs)
	pn, ptp := cells[[2]string{podnetStack, seqMode}], cells[[2]string{ptpStack, seqMode}]
	if pc := cells[[2]string{podnetStack, concMode}]; pn != nil && pc != nil && pc.add.cpu() > 1.3*pn.add.cpu() {
		var user, sys float64
		var n int
		for _, run := range c.Runs {
			if run.Stack == podnetStack && run.Mode == concMode {
				user, sys, n = user+run.AddUserMs, sys+run.AddSysMs, n+run.Pods
			}
		}
		r.notes = append(r.notes, fmt.Sprintf("podnet's CPU per ADD grows from %s ms sequential to %s ms with %d concurrent ADDs (%s ms user, %s ms system per ADD): the growth is system time, spent in the kernel.",
			fmtMs(pn.add.cpu()), fmtMs(pc.add.cpu()), concWorkers(c), fmtMs(user/float64(n)), fmtMs(sys/float64(n))))
	}
	lib := byName["libcni ADD of the no-op binary as a plugin"]
	direct := byName["veth pair create (peer in the pod netns), in-process"]
	moved := byName["veth pair create in the node netns, then peer moved to the pod netns, in-process"]
	del := byName["veth pair delete, in-process"]
	if pn != nil && ptp != nil && len(lib.Ms) > 0 && len(direct.Ms) > 0 {
		floor := median(lib.Ms) + median(direct.Ms)
		r.f("An ADD cannot be cheaper than one exec through libcni plus one veth pair: %s + %s = %s ms here. ", fmtMs(median(lib.Ms)), fmtMs(median(direct.Ms)), fmtMs(floor))
		r.f("Sequential ADD p50: podnet %s ms (%.1f× that floor), ptp+host-local %s ms (%.1f×).", fmtMs(pn.add.p(50)), pn.add.p(50)/floor, fmtMs(ptp.add.p(50)), ptp.add.p(50)/floor)
		if len(del.Ms) > 0 {
			cniDel := byName["libcni DEL of the no-op binary as a plugin"]
			r.f(" A DEL that deletes the veth pair is bounded below by the exec plus the veth delete, %s + %s ms p50: ptp+host-local %s ms. podnet's DEL detaches the pair instead (section 1, whole teardown) and is bounded by the exec, %s ms: podnet %s ms.",
				fmtMs(median(cniDel.Ms)), fmtMs(median(del.Ms)), fmtMs(ptp.del.p(50)), fmtMs(median(cniDel.Ms)), fmtMs(pn.del.p(50)))
		}
		r.f("\n\n")
		if len(moved.Ms) > 0 && len(direct.Ms) > 0 {
			r.notes = append(r.notes, fmt.Sprintf("The veth floors: created in the node netns and then moved into the pod netns a pair costs %s ms p50, created with its peer directly in the pod netns %s ms. podnet creates the pod end in the pod netns under its final name (plugins/veth/vethpair.go createVeth, one RTM_NEWLINK with IFLA_NET_NS_FD for the peer); section 1b has the before/after by step.",
				fmtMs(median(moved.Ms)), fmtMs(median(direct.Ms))))
		}
	}
}

func concWorkers(c *cniData) int {
	for _, r := range c.Runs {
		if r.Mode == concMode {
			return r.Workers
		}
	}
	return 0
}

func (r *report) routedSection(d *routedData) {
	r.f("## 5. podnet-routed\n\n")
	r.f("One real kube-apiserver + etcd; Node objects created in bulk (32 concurrent creates, no client rate limit), each with a /24 PodCIDR from 10.0.0.0/8 and an InternalIP in the node's underlay /16. For every scale a fresh node netns runs a fresh `podnet-routed %s` that reaches the API server through a TCP forwarder. ", d.Flags)
	r.f("*Sync → routes* is from the daemon's \"node informer synced\" log record to the moment a netlink route subscription in the node netns has seen all N podnet routes (N−1 remote PodCIDRs and the local blackhole). ")
	r.f("*Update* is from issuing a status patch that changes one remote Node's InternalIP to the kernel's RTM_NEWROUTE with the new gateway, %d samples per scale (nearest-rank percentiles: with fewer than 100 samples p99 is the max). RSS is VmRSS after the updates (peak = VmHWM).\n\n", d.Samples)
	r.f("| Nodes | create (s) | start → synced (s) | sync → routes (s) | sync → \"routes applied\" (s) | update p50 (ms) | p90 | p99 | max | patch round trip p50 (ms) | RSS (MiB) | peak RSS (MiB) | routes programmed |\n")
	r.f("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range d.Scales {
		timeouts := ""
		if s.UpdateTimeouts > 0 {
			timeouts = fmt.Sprintf(" (%d timeouts)", s.UpdateTimeouts)
		}
		polled := ""
		if s.Polled {
			polled = " (polled)"
		}
		r.f("| %d | %.1f | %.3f | %.3f%s | %.3f | %s%s | %s | %s | %s | %s | %.1f | %.1f | %.0f |\n", s.Nodes, s.CreateS, s.StartToSyncS, s.SyncToRoutesS, polled, s.SyncToAppliedS,
			fmtMs(median(s.UpdateMs)), timeouts, fmtMs(pct(s.UpdateMs, 90)), fmtMs(pct(s.UpdateMs, 99)), fmtMs(maxOf(s.UpdateMs)), fmtMs(median(s.UpdateAPIMs)),
			float64(s.RSSKiB)/1024, float64(s.HWMKiB)/1024, s.MetricRoutes)
	}
	r.f("\n")
	if path, err := plotRouted(r.plots, d.Scales); err == nil {
		r.f("![podnet-routed convergence, update latency and memory against the number of Nodes](%s)\n\n", r.rel(path))
	} else {
		r.f("(plot failed: %v)\n\n", err)
	}
	// Growth exponent between the two largest scales.
	if n := len(d.Scales); n >= 2 {
		a, b := d.Scales[n-2], d.Scales[n-1]
		if a.SyncToRoutesS > 0 && b.SyncToRoutesS > 0 {
			k := math.Log(b.SyncToRoutesS/a.SyncToRoutesS) / math.Log(float64(b.Nodes)/float64(a.Nodes))
			if k > 1.5 {
				r.notes = append(r.notes, fmt.Sprintf("podnet-routed's initial sync grows like N^%.1f between %d and %d Nodes (%.2f s → %.2f s), not linearly. "+
					"In routed/dataplane/dataplane.go, ApplyRoutes calls replaceOwned for every route, and replaceOwned lists the routes (RouteListFiltered with a destination filter, which netlink applies after dumping the whole main table) to look for a foreign route at that destination: one full table dump per route installed. "+
					"One dump before the loop, indexed by destination, would make it linear. A single-Node update also recomputes every Node and dumps the whole table (OwnedRoutes, then replaceOwned for the changed route), so its latency grows with the cluster too.",
					k, a.Nodes, b.Nodes, a.SyncToRoutesS, b.SyncToRoutesS))
			}
		}
	}
	var last *routedScale
	for i := range d.Scales {
		if last == nil || d.Scales[i].Nodes > last.Nodes {
			last = &d.Scales[i]
		}
	}
	if last != nil {
		sync := last.SyncToRoutesS
		r.targets = append(r.targets, target{fmt.Sprintf("%d Nodes programmed within 2 s of informer sync", last.Nodes), fmt.Sprintf("%.2f s", sync), met(sync <= 2),
			gapSecs(sync, 2)})
		p99 := pct(last.UpdateMs, 99)
		gap := fmt.Sprintf("%.1f ms under", 50-p99)
		if p99 >= 50 {
			gap = fmt.Sprintf("%.1f ms over (%.2f×)", p99-50, p99/50)
		}
		if last.UpdateTimeouts > 0 {
			gap += fmt.Sprintf("; %d updates never seen", last.UpdateTimeouts)
		}
		r.targets = append(r.targets, target{fmt.Sprintf("Node change → route p99 < 50 ms (at %d Nodes)", last.Nodes), fmt.Sprintf("%s ms (p50 %s)", fmtMs(p99), fmtMs(median(last.UpdateMs))), met(p99 < 50 && last.UpdateTimeouts == 0), gap})
		for _, s := range d.Scales {
			if s.Nodes != last.Nodes {
				if p := pct(s.UpdateMs, 99); p >= 50 {
					r.notes = append(r.notes, fmt.Sprintf("At %d Nodes the update p99 is %s ms.", s.Nodes, fmtMs(p)))
				}
			}
		}
		rss, hwm := float64(last.RSSKiB)/1024, float64(last.HWMKiB)/1024
		gapM := fmt.Sprintf("%.1f MiB under", 64-rss)
		if rss >= 64 {
			gapM = fmt.Sprintf("%.1f MiB over", rss-64)
		}
		gapM += fmt.Sprintf("; peak %.1f MiB", hwm)
		r.targets = append(r.targets, target{fmt.Sprintf("RSS < 64 MiB at %d Nodes", last.Nodes), fmt.Sprintf("%.1f MiB", rss), met(rss < 64), gapM})
	}
}

func gapSecs(got, want float64) string {
	if got <= want {
		return fmt.Sprintf("%.2f s to spare", want-got)
	}
	return fmt.Sprintf("%.2f s over (%.1f×)", got-want, got/want)
}

func (r *report) datapathSection(d *datapathData) {
	r.f("## 6. Data path\n\n")
	r.f("Two node netns on one L2 underlay (a bridge in its own netns, MTU 1500), podnet-routed in each, one pod per node attached by podnet + podnet-ipam (`usePodCidr`) through libcni. %s, one TCP stream, %d s per run after %d s omitted, pod → pod across the nodes and node → node over the same underlay, taking turns. Throughput is the receiver's, in Gbit/s; ratio = median(pod) ÷ median(node) of the same mode.\n\n", d.Iperf, d.Duration, d.Omit)
	r.f("| encap | pod MTU | node↔node | pod↔pod | pod ÷ node | per-repetition ratios | MSS pod / node | retransmits pod / node | DF ping of the pod MTU | one byte more | fragmentation on the path |\n")
	r.f("|---|---:|---:|---:|---:|---|---|---|---|---|---|\n")
	for _, m := range d.Modes {
		var pod, node []float64
		var podRe, nodeRe, podMSS, nodeMSS int
		byRep := map[int][2]float64{}
		for _, run := range m.Runs {
			v := byRep[run.Rep]
			if run.Path == "pod" {
				pod = append(pod, run.Gbps)
				podRe += run.Retransmits
				podMSS = run.MSS
				v[0] = run.Gbps
			} else {
				node = append(node, run.Gbps)
				nodeRe += run.Retransmits
				nodeMSS = run.MSS
				v[1] = run.Gbps
			}
			byRep[run.Rep] = v
		}
		var per []string
		for rep := 1; rep <= len(byRep); rep++ {
			if v := byRep[rep]; v[1] > 0 {
				per = append(per, fmt.Sprintf("%.2f", v[0]/v[1]))
			}
		}
		ratio := median(pod) / median(node)
		fits := "passes"
		if m.PingFits != "" {
			fits = "FAILS: " + mdEscape(m.PingFits)
		}
		over := "answered (wrong)"
		if m.PingOver != "" {
			over = "refused: `" + mdEscape(m.PingOver) + "`"
		}
		frag := "none"
		if len(m.FragDelta) > 0 {
			var parts []string
			for k, v := range m.FragDelta {
				parts = append(parts, k+": "+v)
			}
			slices.Sort(parts)
			frag = strings.Join(parts, "; ")
		}
		r.f("| %s | %d | %.2f | %.2f | %.0f %% | %s | %d / %d | %d / %d | %s | %s | %s |\n", m.Encap, m.PodMTU, median(node), median(pod), ratio*100, strings.Join(per, ", "),
			podMSS, nodeMSS, podRe, nodeRe, fits, over, frag)
		if m.Encap == "none" {
			gap := fmt.Sprintf("%.0f points above", (ratio-0.9)*100)
			if ratio < 0.9 {
				gap = fmt.Sprintf("%.0f points short", (0.9-ratio)*100)
			}
			r.targets = append(r.targets, target{"pod↔pod ≥ 90 % of node↔node, `none` mode", fmt.Sprintf("%.0f %% (%.2f vs %.2f Gbit/s)", ratio*100, median(pod), median(node)), met(ratio >= 0.9), gap})
		}
		if m.PingFits != "" || m.PingOver == "" || len(m.FragDelta) > 0 {
			r.notes = append(r.notes, fmt.Sprintf("%s mode: the MTU checks did not all pass (see section 6).", m.Encap))
		}
	}
	r.f("\n")
	r.f("*Fragmentation on the path* lists the IPv4 `Frag*`/`Reasm*` counters (/proc/net/snmp of each node, pod and underlay netns) that moved during the transfers and pings; \"none\" means MTU-sized segments crossed without any fragmentation.\n\n")
}

// teardownTable shows the whole teardown of a run as the node pays it: the
// DEL phase, then removing the pod netns as the runtime does, then the
// kernel tearing down what they held until the node is back to its state
// before the run. podnet's DEL detaches the veth and leaves its delete to
// the netns teardown, so its DEL must be read together with the rest.
func (r *report) teardownTable(runs []cniRun) {
	type acc struct{ del, netns, settle []float64 }
	per := map[[2]string]*acc{}
	for _, run := range runs {
		if run.NetnsDelS == 0 && run.SettleS == 0 {
			continue // results from before the bench removed pod netns
		}
		k := [2]string{run.Stack, run.Mode}
		if per[k] == nil {
			per[k] = &acc{}
		}
		n := float64(run.Pods)
		per[k].del = append(per[k].del, run.DelWallS*1000/n)
		per[k].netns = append(per[k].netns, run.NetnsDelS*1000/n)
		per[k].settle = append(per[k].settle, run.SettleS*1000/n)
	}
	if len(per) == 0 {
		return
	}
	r.f("Whole teardown per pod (ms; median over the repetitions of phase wall time ÷ pods): the DEL phase, removing the pod netns after it as a runtime does, and the kernel's background teardown of the netns until the node is back to its state before the run. ")
	r.f("podnet's DEL detaches the veth pair (both ends down, routes gone, CNI_IFNAME freed) and leaves its delete to the netns teardown, where the kernel removes many devices behind one RCU grace period; the reference plugins delete the pair in DEL.\n\n")
	r.f("| stack | mode | DEL phase | netns removal | kernel teardown | total |\n|---|---|---:|---:|---:|---:|\n")
	for _, mode := range []string{seqMode, concMode} {
		for _, s := range stackOrder {
			a := per[[2]string{s, mode}]
			if a == nil {
				continue
			}
			d, n, st := median(a.del), median(a.netns), median(a.settle)
			r.f("| %s | %s | %s | %s | %s | %s |\n", s, mode, fmtMs(d), fmtMs(n), fmtMs(st), fmtMs(d+n+st))
		}
	}
	r.f("\n")
}
