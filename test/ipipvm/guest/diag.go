package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/test/nettest"
)

// diagnose prints what a failure needs to be understood from the console
// alone: every namespace's links (with counters), addresses and routes,
// node.json, the tail of each podnet-routed log, loaded modules and the
// kernel log's tail.
func (g *guest) diagnose() {
	show := func(title string, n ns.NetNS, args ...string) {
		var out []byte
		var err error
		if n == nil {
			out, err = exec.Command(args[0], args[1:]...).CombinedOutput()
		} else {
			var o string
			o, err = nettest.ExecIn(context.Background(), n, args[0], args[1:]...)
			out = []byte(o)
		}
		fmt.Printf("--- diag %s: %s", title, strings.Join(args, " "))
		if err != nil {
			fmt.Printf(" (%v)", err)
		}
		fmt.Printf("\n%s\n", strings.TrimRight(string(out), "\n"))
	}
	for _, n := range g.nodes {
		if n.netns != nil {
			fmt.Printf("--- diag %s: link counters\n%s\n", n.Name, linkCounters(n.netns))
			show(n.Name, n.netns, "ip", "addr")
			show(n.Name, n.netns, "ip", "route")
		}
		if n.podNS != nil {
			show(n.podName, n.podNS, "ip", "addr")
			show(n.podName, n.podNS, "ip", "route")
		}
		if data, err := os.ReadFile(n.stateDir + "/node.json"); err == nil {
			fmt.Printf("--- diag %s: node.json\n%s\n", n.Name, strings.TrimSpace(string(data)))
		}
		fmt.Printf("--- diag %s: podnet-routed log (last %d lines)\n%s\n", n.Name, routedLogLines, routedLogTail(n))
	}
	show("vm", nil, "ip", "link")
	show("vm", nil, "lsmod")
	show("vm", nil, "sh", "-c", "dmesg | tail -n 30")
}

// linkCounters lists n's links with their packet counters (busybox ip has
// no -s).
func linkCounters(n ns.NetNS) string {
	var b strings.Builder
	err := n.Do(func(ns.NetNS) error {
		links, err := netlinksafe.LinkList()
		for _, l := range links {
			a := l.Attrs()
			fmt.Fprintf(&b, "%s (%s, mtu %d, %s)", a.Name, l.Type(), a.MTU, a.OperState)
			if s := a.Statistics; s != nil {
				fmt.Fprintf(&b, " rx %d pkts %d bytes, tx %d pkts %d bytes, rx dropped %d, tx dropped %d, tx errors %d",
					s.RxPackets, s.RxBytes, s.TxPackets, s.TxBytes, s.RxDropped, s.TxDropped, s.TxErrors)
			}
			b.WriteString("\n")
		}
		return err
	})
	if err != nil {
		fmt.Fprintf(&b, "(%v)", err)
	}
	return strings.TrimRight(b.String(), "\n")
}
