// Command podnet-install puts podnet on a node. The podnet-node DaemonSet
// runs it as its init containers; scripts/install.sh runs it on hosts
// without Kubernetes.
//
//	podnet-install [flags]              copy the CNI plugins, then write the conflist
//	podnet-install --uninstall [flags]  remove the conflist, then the plugins
//	podnet-install prepare-node [flags] sysctls and tunnel devices for an
//	                                    unprivileged podnet-routed
//
// Every flag has an environment default so the DaemonSet can pass its
// ConfigMap through env.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/routed/install"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "prepare-node" {
		err = prepareNode(os.Args[2:])
	} else {
		err = runInstall(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podnet-install:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(env(name, "")); err == nil {
		return v
	}
	return def
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "podnet-install: "+format+"\n", args...)
}

func runInstall(argv []string) error {
	self, _ := os.Executable()
	fs := flag.NewFlagSet("podnet-install", flag.ContinueOnError)
	src := fs.String("src-dir", env("PODNET_SRC_DIR", filepath.Dir(self)), "directory holding the plugin binaries to install (env PODNET_SRC_DIR; default: this program's directory)")
	binDir := fs.String("bin-dir", env("CNI_BIN_DIR", "/opt/cni/bin"), "CNI plugin directory (env CNI_BIN_DIR)")
	confDir := fs.String("conf-dir", env("CNI_CONF_DIR", "/etc/cni/net.d"), "CNI config directory (env CNI_CONF_DIR)")
	confName := fs.String("conf-name", env("PODNET_CONF_NAME", install.DefaultConfName), "conflist file name (env PODNET_CONF_NAME)")
	plugin := fs.String("plugin", env("PODNET_PLUGIN", "podnet"), "main plugin: podnet or podnet-bridge (env PODNET_PLUGIN)")
	cniVersion := fs.String("cni-version", env("PODNET_CNI_VERSION", install.DefaultCNIVersion), "conflist cniVersion (env PODNET_CNI_VERSION)")
	mtu := fs.Int("mtu", envInt("PODNET_MTU", 0), "pod MTU in the conflist; 0 leaves it to podnet-routed's node.json (env PODNET_MTU)")
	subnet := fs.String("subnet", env("PODNET_SUBNET", ""), "pod subnet of this host; empty uses the node's PodCIDR from podnet-routed (env PODNET_SUBNET)")
	stateDir := fs.String("state-dir", env("PODNET_STATE_DIR", ""), "podnet state dir written into the conflist (node.json, ipam/); empty: /run/podnet (env PODNET_STATE_DIR)")
	clusterCIDR := fs.String("cluster-cidr", os.Getenv("CLUSTER_CIDR"), "comma-separated cluster pod CIDRs: the conflist gives pods an address of each of their families from the node's PodCIDRs (env CLUSTER_CIDR; empty: IPv4)")
	portmap := fs.Bool("portmap", env("PODNET_PORTMAP", "") == "true", "chain the reference portmap plugin for hostPort (its binary is not shipped) (env PODNET_PORTMAP=true)")
	force := fs.Bool("force", false, "overwrite a foreign conflist of the same name; install even when another config sorts first")
	uninstall := fs.Bool("uninstall", false, "remove the conflist and the plugin binaries instead")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cidrs, err := parseCIDRList(*clusterCIDR)
	if err != nil {
		return fmt.Errorf("--cluster-cidr: %w", err)
	}
	o := install.Options{
		SrcDir: *src, BinDir: *binDir, ConfDir: *confDir, ConfName: *confName, Force: *force, Logf: logf,
		Conf: install.Conf{CNIVersion: *cniVersion, Plugin: *plugin, MTU: *mtu, Subnet: *subnet, ClusterCIDRs: cidrs,
			StateDir: *stateDir, Portmap: *portmap},
	}
	if *uninstall {
		return install.Uninstall(o)
	}
	res, err := install.Install(o)
	if err != nil {
		return err
	}
	logf("done: %d file(s) written, %d unchanged", len(res.Changed), len(res.Unchanged))
	return nil
}

func prepareNode(argv []string) error {
	fs := flag.NewFlagSet("podnet-install prepare-node", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default: in-cluster config)")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's name (env NODE_NAME)")
	encap := fs.String("encap", env("PODNET_ENCAP", "ipip"), "encapsulation podnet-routed will use: ipip, vxlan or none (env PODNET_ENCAP)")
	clusterCIDR := fs.String("cluster-cidr", os.Getenv("CLUSTER_CIDR"), "comma-separated cluster pod CIDRs; an IPv6 one turns on IPv6 forwarding (env CLUSTER_CIDR)")
	mtu := fs.Int("mtu", envInt("PODNET_MTU", 0), "overlay MTU, as given to podnet-routed (env PODNET_MTU)")
	vni := fs.Int("vxlan-vni", 4096, "VXLAN network identifier, as given to podnet-routed")
	port := fs.Int("vxlan-port", 4789, "VXLAN UDP port, as given to podnet-routed")
	procSys := fs.String("proc-sys", "/proc/sys", "where the host's /proc/sys is writable (in the DaemonSet: /host/proc/sys)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	e, err := desired.ParseEncap(*encap)
	if err != nil {
		return fmt.Errorf("--encap: %w", err)
	}
	if *nodeName == "" {
		return fmt.Errorf("--node-name (or NODE_NAME) is required")
	}
	p := install.Prep{NodeName: *nodeName, Encap: e, MTU: *mtu, VXLANVNI: *vni, VXLANPort: *port, ProcSys: *procSys,
		Log: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	if p.ClusterCIDRs, err = parseCIDRList(*clusterCIDR); err != nil {
		return fmt.Errorf("--cluster-cidr: %w", err)
	}
	var cfg *rest.Config
	if *kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	}
	if err != nil {
		return fmt.Errorf("kubernetes config: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := p.Run(ctx, client); err != nil {
		return err
	}
	logf("node %s prepared for encap %s", *nodeName, e)
	return nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	return p.Masked(), err
}

// parseCIDRList parses a comma-separated list of CIDRs (empty items are
// skipped).
func parseCIDRList(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		c, err := parsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}
