package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
)

// Every controlEvery ADDs of the occupancy run, a stack's control node
// ADDs (then DELs) controlPods pods: close enough in time that a burst of
// the machine's other work hits both.
const (
	controlEvery = 10
	controlPods  = 2
)

const (
	podnetStack = "podnet+podnet-ipam"
	refStack    = "ptp+host-local"
)

// occSide is one stack of the occupancy run: the node that fills up and
// its control node, which stays empty.
type occSide struct {
	full, control *stack
	rts           []*libcni.RuntimeConf
}

// occupancyRun fills one node per stack with n pods, one at a time, the
// stacks taking turns every chunk pods, then deletes them the same way.
// Every controlEvery of a stack's ADDs its control node ADDs controlPods
// pods in fresh netns and DELs them (see occResult.ControlAddMs). full
// runs once every node holds its n pods, before the DELs.
func occupancyRun(root string, paths []string, pool []ns.NetNS, n, chunk, warmup int, full func()) []occResult {
	specs := []struct{ name, plugin, ipam, subnet, ctlSubnet string }{
		{podnetStack, "podnet", "podnet-ipam", "10.211.0.0/16", "10.221.0.0/16"},
		{refStack, "ptp", "host-local", "10.213.0.0/16", "10.223.0.0/16"},
	}
	sides := make([]occSide, len(specs))
	out := make([]occResult, len(specs))
	for k, sp := range specs {
		sd := &sides[k]
		sd.full = newStack(root, "occ-"+sp.name, sp.plugin, sp.ipam, sp.subnet, paths)
		sd.control = newStack(root, "occ-control-"+sp.name, sp.plugin, sp.ipam, sp.ctlSubnet, paths)
		for _, s := range []*stack{sd.full, sd.control} {
			if err := s.prepare(newNode(), warmup); err != nil {
				fatalf("%s: %v", s.Name, err)
			}
		}
		out[k] = occResult{Stack: sp.name, Pods: n, Chunk: chunk, AddMs: make([]float64, n), DelMs: make([]float64, n)}
		for i := 0; i < n; i++ {
			sd.rts = append(sd.rts, sd.full.rtConf(fmt.Sprintf("occ-%d", i), pool[k*n+i]))
		}
	}
	start := time.Now()
	for _, verb := range []string{"ADD", "DEL"} {
		if verb == "DEL" {
			full()
		}
		for c, lo := 0, 0; lo < n; c, lo = c+1, lo+chunk {
			hi := min(lo+chunk, n)
			for j := range sides {
				k := (j + c) % len(sides) // who goes first alternates
				sides[k].chunk(&out[k], verb, lo, hi, c)
			}
			if hi%200 == 0 || hi == n {
				logf("occupancy: %s %d/%d pods per node (%.0fs)", verb, hi, n, time.Since(start).Seconds())
			}
		}
	}
	for k, sd := range sides {
		out[k].Leak = sd.finish(pool[k*n : (k+1)*n])
		logf("occupancy %s: first 100 ADD p50 %.2f ms, last 100 %.2f ms, leak: %s", out[k].Stack,
			median(out[k].AddMs[:min(100, n)]), median(out[k].AddMs[max(0, n-100):]), orNone(out[k].Leak))
	}
	return out
}

// chunk runs verb for the full node's pods lo..hi-1; ADD does them
// controlEvery at a time, each batch followed by a control round.
func (sd *occSide) chunk(o *occResult, verb string, lo, hi, c int) {
	if verb != "ADD" {
		sd.phase(o, verb, lo, hi)
		return
	}
	var ctl []float64
	for b := lo; b < hi; b += controlEvery {
		e := min(b+controlEvery, hi)
		if sd.full.Plugin == "podnet" {
			o.InsideMs = append(o.InsideMs, sd.insideOf(func() { sd.phase(o, verb, b, e) })...)
		} else {
			sd.phase(o, verb, b, e)
		}
		ctl = append(ctl, sd.controlRound(o, fmt.Sprintf("%d-%d", c, b))...)
	}
	o.ControlAddMs = append(o.ControlAddMs, ctl)
}

func (sd *occSide) phase(o *occResult, verb string, lo, hi int) {
	lat, _, user, sys, errs := sd.full.phase(verb, sd.rts[lo:hi], 1)
	if verb == "ADD" {
		copy(o.AddMs[lo:hi], lat)
		o.AddUserMs += ms(user)
		o.AddSysMs += ms(sys)
	} else {
		copy(o.DelMs[lo:hi], lat)
		o.DelUserMs += ms(user)
		o.DelSysMs += ms(sys)
	}
	o.addErrors(errs)
}

// insideOf runs f with podnet's step trace on and returns each traced
// ADD's time inside the plugin, in order.
func (sd *occSide) insideOf(f func()) []float64 {
	trace, stop := startTrace()
	defer stop()
	f()
	os.Unsetenv("PODNET_TRACE")
	data, err := os.ReadFile(trace)
	if err != nil {
		fatalf("%v", err)
	}
	var out []float64
	for _, line := range bytes.Split(data, []byte("\n")) {
		var l struct {
			Verb   string
			WallUs int64
		}
		if json.Unmarshal(line, &l) == nil && l.Verb == "ADD" {
			out = append(out, float64(l.WallUs)/1000)
		}
	}
	return out
}

// controlRound ADDs controlPods pods on the control node, each in a fresh
// netns, DELs them and removes their netns; it returns the ADDs' times.
func (sd *occSide) controlRound(o *occResult, round string) []float64 {
	pods := newPods(controlPods)
	rts := make([]*libcni.RuntimeConf, len(pods))
	for i, p := range pods {
		rts[i] = sd.control.rtConf(fmt.Sprintf("ctl-%s-%d", round, i), p)
	}
	lat, _, _, _, errs := sd.control.phase("ADD", rts, 1)
	o.addErrors(errs)
	_, _, _, _, errs = sd.control.phase("DEL", rts, 1)
	o.addErrors(errs)
	removePods(pods)
	return lat
}

func (o *occResult) addErrors(errs []string) {
	if len(o.Errors) < 6 {
		o.Errors = append(o.Errors, errs...)
	}
}

// finish removes the full node's pod netns and checks both nodes for
// leaks; it returns the first found ("" for none).
func (sd *occSide) finish(pods []ns.NetNS) string {
	podLeaks := checkPodLinks(pods)
	removePods(pods)
	for _, s := range []*stack{sd.full, sd.control} {
		_, err := settle(s.node, s.base)
		if err == nil && s == sd.full {
			err = podLeaks
		}
		if err == nil {
			err = checkLeaks(s.base, s.node, s.dataDirs, nil)
		}
		if err != nil {
			return fmt.Sprintf("%s: %v", s.Name, err)
		}
	}
	return ""
}
