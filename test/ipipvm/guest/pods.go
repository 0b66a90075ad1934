package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/plugins/veth"
	"github.com/podnet/podnet/test/ipipvm/vmconf"
	"github.com/podnet/podnet/test/nettest"
)

// netConf is the podnet network config for n, as a runtime would pass it:
// podnet-ipam with the node's PodCIDR written out, or "usePodCidr" (taken
// from the node.json podnet-routed published), and no mtu, so the plugin
// takes the pod MTU from node.json.
func (g *guest) netConf(n *node) []byte {
	subnet := n.cidr.String()
	if n.UsePodCIDR {
		subnet = "usePodCidr"
	}
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       "podnet",
		"type":       "podnet",
		"stateDir":   n.stateDir,
		"ipam": map[string]any{
			"type":    "podnet-ipam",
			"ranges":  [][]map[string]string{{{"subnet": subnet}}},
			"dataDir": filepath.Join(n.stateDir, "ipam"),
		},
	}
	b, _ := json.Marshal(conf)
	return b
}

// cni execs bin/podnet in n's netns with the CNI environment, as the
// container runtime of that node would.
func (g *guest) cni(n *node, command string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(vmconf.BinDir, "podnet"))
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+n.podName,
		"CNI_NETNS=/run/netns/"+n.podName,
		"CNI_IFNAME=eth0",
		"CNI_PATH="+vmconf.BinDir,
	)
	cmd.Stdin = bytes.NewReader(g.netConf(n))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := n.netns.Do(func(ns.NetNS) error { return cmd.Run() })
	if err != nil {
		return nil, fmt.Errorf("podnet %s for %s on %s: %v: %s %s", command, n.podName, n.Name, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// addPods creates one pod per node with the podnet plugin and checks its
// address is in the node's PodCIDR and its MTU is node.json's.
func (g *guest) addPods() error {
	wantMTU := underlayMTU - ipipOverhead
	for _, n := range g.nodes {
		out, err := g.cni(n, "ADD")
		if err != nil {
			return err
		}
		var res struct {
			Interfaces []struct {
				Name    string `json:"name"`
				Sandbox string `json:"sandbox"`
			} `json:"interfaces"`
			IPs []struct {
				Address string `json:"address"`
			} `json:"ips"`
		}
		if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 {
			return fmt.Errorf("%s: unexpected ADD result %s (%v)", n.podName, out, err)
		}
		p, err := netip.ParsePrefix(res.IPs[0].Address)
		if err != nil {
			return err
		}
		if !n.cidr.Contains(p.Addr()) || p.Bits() != 32 {
			return fmt.Errorf("%s got %s: want a /32 in %s", n.podName, p, n.cidr)
		}
		for _, i := range res.Interfaces {
			if i.Sandbox == "" {
				n.hostVeth = i.Name
			}
		}
		if n.hostVeth == "" {
			return fmt.Errorf("%s: no host interface in the ADD result %s", n.podName, out)
		}
		n.podIP = p.Addr()
		var mtu int
		err = n.podNS.Do(func(ns.NetNS) error {
			l, err := netlinksafe.LinkByName("eth0")
			if err == nil {
				mtu = l.Attrs().MTU
			}
			return err
		})
		if err != nil {
			return err
		}
		if mtu != wantMTU {
			return fmt.Errorf("%s: eth0 mtu %d, want %d from %s/node.json", n.podName, mtu, wantMTU, n.stateDir)
		}
		ipam := "explicit range " + n.cidr.String()
		if n.UsePodCIDR {
			ipam = "usePodCidr from node.json"
		}
		g.logf("%s on %s: %s (ipam %s), eth0 mtu %d, host veth %s", n.podName, n.Name, p, ipam, mtu, n.hostVeth)
	}
	// The pod routes (same protocol as podnet-routed's) are in place and
	// podnet-routed's own are unchanged.
	for _, n := range g.nodes {
		if err := g.waitRoutes(n, g.wantRoutes(n, ""), 5*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// ping sends count echo requests from src's pod to dst's pod and waits
// up to wait seconds for the last reply.
func (g *guest) ping(src, dst *node, count, wait int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count+wait+10)*time.Second)
	defer cancel()
	out, err := nettest.ExecIn(ctx, src.podNS, "ping", "-c", strconv.Itoa(count), "-A", "-W", strconv.Itoa(wait), dst.podIP.String())
	if err != nil {
		return fmt.Errorf("ping %s (%s) -> %s (%s): %v: %s", src.podName, src.podIP, dst.podName, dst.podIP, err, strings.TrimSpace(out))
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	g.logf("ping %s -> %s: %s", src.podName, dst.podName, lines[len(lines)-1])
	return nil
}

// traffic pings between every ordered pair of pods on different nodes and
// sends a TCP stream of full-size segments, then requires every node's
// tunl0 to have received and sent at least the echo requests and replies
// that crossed it.
func (g *guest) traffic() error {
	before := map[string]tunnelStats{}
	for _, n := range g.nodes {
		st, err := linkStats(n.netns, "tunl0")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		before[n.Name] = st
	}
	for _, src := range g.nodes {
		for _, dst := range g.nodes {
			if src != dst {
				if err := g.ping(src, dst, pingsPerPair, 3); err != nil {
					return err
				}
			}
		}
	}
	if err := g.tcpTransfer(g.nodes[0], g.nodes[len(g.nodes)-1]); err != nil {
		return err
	}
	// Each node sends and answers pingsPerPair echoes to/from every other one.
	want := uint64(2 * pingsPerPair * (len(g.nodes) - 1))
	var errs []string
	for _, n := range g.nodes {
		st, err := linkStats(n.netns, "tunl0")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		b := before[n.Name]
		rx, tx := st.rxPackets-b.rxPackets, st.txPackets-b.txPackets
		g.result("%s tunl0 rx_packets %d -> %d (+%d), tx_packets %d -> %d (+%d), rx_bytes +%d, tx_bytes +%d",
			n.Name, b.rxPackets, st.rxPackets, rx, b.txPackets, st.txPackets, tx, st.rxBytes-b.rxBytes, st.txBytes-b.txBytes)
		if rx < want || tx < want {
			errs = append(errs, fmt.Sprintf("%s tunl0 moved rx +%d tx +%d, want at least +%d each", n.Name, rx, tx, want))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("pod traffic did not go through tunl0: %s", strings.Join(errs, "; "))
	}
	return nil
}

// tcpTransfer streams tcpBytes from src's pod to a listener in dst's pod
// and expects the byte count back: full-size segments only pass if the pod
// MTU leaves room for the IPIP header on the underlay.
func (g *guest) tcpTransfer(src, dst *node) error {
	addr := net.JoinHostPort(dst.podIP.String(), "9000")
	var ln net.Listener
	err := dst.podNS.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
	}()
	start := time.Now()
	var conn net.Conn
	err = src.podNS.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.DialTimeout("tcp4", addr, 5*time.Second)
		return err
	})
	if err != nil {
		return fmt.Errorf("tcp %s -> %s: %w", src.podName, addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write(bytes.Repeat([]byte("podnet-ipip!"), tcpBytes/12)); err != nil {
		return fmt.Errorf("tcp %s -> %s: write: %w", src.podName, addr, err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	reply, err := io.ReadAll(conn)
	if err != nil {
		return fmt.Errorf("tcp %s -> %s: read: %w", src.podName, addr, err)
	}
	if got, want := strings.TrimSpace(string(reply)), strconv.Itoa(tcpBytes/12*12); got != want {
		return fmt.Errorf("tcp %s -> %s: peer received %q bytes, want %s", src.podName, addr, got, want)
	}
	g.logf("tcp %s -> %s: %d bytes in %s", src.podName, dst.podName, tcpBytes/12*12, time.Since(start).Round(time.Millisecond))
	return nil
}

// deletePods runs CNI DEL for every pod and checks the host side is out of
// service: no host veth left but the pair DEL detached (down, marked; the
// kernel removes it with the pod netns).
func (g *guest) deletePods() error {
	for _, n := range g.nodes {
		if _, err := g.cni(n, "DEL"); err != nil {
			return err
		}
		n.podIP = netip.Addr{}
		var left []string
		err := n.netns.Do(func(ns.NetNS) error {
			links, err := netlinksafe.LinkList()
			for _, l := range links {
				if contract.IsHostVeth(l.Attrs().Name) && !veth.IsDetached(l) {
					left = append(left, l.Attrs().Name)
				}
			}
			return err
		})
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%s: host veths %v left after DEL", n.Name, left)
		}
	}
	g.logf("CNI DEL done for every pod, no host veth left in service")
	return nil
}

// egress checks podnet-routed's masquerade: its nft table is in place, and
// a pod reaches the API server on the host, an address outside the
// cluster CIDR, through the node's mgmt0 and QEMU user networking.
func (g *guest) egress() error {
	n := g.nodes[0]
	c, err := nftables.New(nftables.WithNetNSFd(int(n.netns.Fd())))
	if err != nil {
		return err
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("%s: list nft chains: %w", n.Name, err)
	}
	rules := -1
	for _, ch := range chains {
		if ch.Table.Name == table.Name && ch.Name == "postrouting" {
			r, err := c.GetRules(table, ch)
			if err != nil {
				return err
			}
			rules = len(r)
		}
	}
	if rules != 2 {
		return fmt.Errorf("%s: nft inet %s postrouting has %d rules, want 2 (return for %s, masquerade %s)", n.Name, table.Name, rules, g.cfg.ClusterCIDR, n.cidr)
	}
	code, _, err := g.apiCall(n.podNS, http.MethodGet, "/version")
	if err != nil {
		return fmt.Errorf("%s (%s) -> API server %s: %w", n.podName, n.podIP, g.cfg.APIServer, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("%s -> API server: HTTP %d", n.podName, code)
	}
	g.logf("%s: nft table inet %s (2 rules); %s reaches the API server %s from outside the cluster CIDR", n.Name, table.Name, n.podName, g.cfg.APIServer)
	return nil
}
