// Command podctl drives pod sandboxes through a runtime's CRI socket, like
// kubelet (a tiny crictl: Debian 12 packages none). It is for trying podnet
// under containerd by hand; test/runtime uses the same client library.
//
//	podctl -socket /path/containerd.sock run NAME [NAMESPACE]   prints the sandbox ID
//	       (-cgroup-parent /x puts the sandbox's cgroups under /x)
//	podctl -socket ... inspect ID    state, IP, netns, pause PID
//	podctl -socket ... stop ID       CNI DEL (with netns and prevResult)
//	podctl -socket ... rm ID         CNI DEL again (containerd 1.6), then gone
//	podctl -socket ... ls            every sandbox
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/podnet/podnet/test/runtime/criclient"
)

func main() {
	socket := flag.String("socket", "/run/containerd/containerd.sock", "CRI unix socket")
	timeout := flag.Duration("timeout", time.Minute, "timeout of the call")
	cgroupParent := flag.String("cgroup-parent", "", "parent cgroup of a new sandbox (cgroupfs path; containerd's default is /k8s.io)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: podctl [-socket PATH] [-cgroup-parent PATH] run NAME [NAMESPACE] | inspect ID | stop ID | rm ID | ls")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	c, err := criclient.Dial(*socket)
	if err != nil {
		fail(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := run(ctx, c, *cgroupParent, flag.Args()); err != nil {
		fail(err)
	}
}

func run(ctx context.Context, c *criclient.Client, cgroupParent string, args []string) error {
	arg := func(i int, def string) string {
		if i < len(args) {
			return args[i]
		}
		if def == "" {
			flag.Usage()
			os.Exit(2)
		}
		return def
	}
	switch args[0] {
	case "run":
		name, ns := arg(1, ""), arg(2, "default")
		id, err := c.RunPod(ctx, criclient.Pod{Name: name, Namespace: ns, UID: ns + "-" + name, CgroupParent: cgroupParent})
		if err == nil {
			fmt.Println(id)
		}
		return err
	case "inspect":
		sb, err := c.Inspect(ctx, arg(1, ""))
		if err == nil {
			fmt.Printf("id=%s name=%s/%s ready=%v ip=%s netns=%s pid=%d\n", sb.ID, sb.Namespace, sb.Name, sb.Ready, sb.IP, sb.NetNS, sb.Pid)
		}
		return err
	case "stop":
		return c.StopPod(ctx, arg(1, ""))
	case "rm":
		return c.RemovePod(ctx, arg(1, ""))
	case "ls":
		pods, err := c.List(ctx)
		for _, p := range pods {
			fmt.Printf("%s %s/%s %s\n", p.Id, p.Metadata.Namespace, p.Metadata.Name, p.State)
		}
		return err
	}
	flag.Usage()
	os.Exit(2)
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "podctl:", err)
	os.Exit(1)
}
