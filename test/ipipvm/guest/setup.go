package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/test/ipipvm/vmconf"
	"github.com/podnet/podnet/test/nettest"
)

const bridgeName = "underlay"

// setupNodes makes, for every node, its netns with
//   - mgmt0: the node's own QEMU NIC (user networking), 10.0.2.15/24,
//     default route via 10.0.2.2, which QEMU forwards to the host's loopback;
//   - eth0: a veth on the "underlay" bridge in the VM's root netns, with the
//     node's InternalIP: the network IPIP runs over;
//
// and an empty pod netns.
func (g *guest) setupNodes() error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName, MTU: underlayMTU}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("create bridge: %w", err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return err
	}
	for _, n := range g.nodes {
		var err error
		nodeNS, err := nettest.NewNamedNetNS(n.Name)
		if err != nil {
			return err
		}
		n.netns = nodeNS.NetNS
		podNS, err := nettest.NewNamedNetNS(n.podName)
		if err != nil {
			return err
		}
		n.podNS = podNS.NetNS
		if err := g.moveMgmtNIC(n); err != nil {
			return err
		}
		hostEnd := "ul-" + n.Name
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: hostEnd, MTU: underlayMTU},
			PeerName:      "eth0",
			PeerNamespace: netlink.NsFd(int(n.netns.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("%s: underlay veth: %w", n.Name, err)
		}
		l, err := netlinksafe.LinkByName(hostEnd)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("%s: enslave %s: %w", n.Name, hostEnd, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		err = n.netns.Do(func(ns.NetNS) error {
			eth0, err := netlinksafe.LinkByName("eth0")
			if err != nil {
				return err
			}
			addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.ip.AsSlice(), Mask: net.CIDRMask(g.cfg.UnderlayBits, 32)}}
			if err := netlink.AddrAdd(eth0, addr); err != nil {
				return fmt.Errorf("address %s: %w", addr, err)
			}
			if err := netlink.LinkSetMTU(eth0, underlayMTU); err != nil {
				return err
			}
			return netlink.LinkSetUp(eth0)
		})
		if err != nil {
			return fmt.Errorf("%s: eth0: %w", n.Name, err)
		}
		g.logf("%s: netns ready, eth0 %s/%d (mtu %d) on bridge %q, mgmt0 %s/24 via %s; pod netns %s",
			n.Name, n.ip, g.cfg.UnderlayBits, underlayMTU, bridgeName, vmconf.GuestMgmtIP, vmconf.APIServerHostIP, n.podName)
	}
	return nil
}

// moveMgmtNIC moves the QEMU NIC with the node's MAC into its netns as
// mgmt0. It is renamed in the root netns first, where it is still down:
// every node's NIC is called mgmt0 in the end.
func (g *guest) moveMgmtNIC(n *node) error {
	mac := n.mac
	links, err := netlinksafe.LinkList()
	if err != nil {
		return err
	}
	var nic netlink.Link
	var seen []string
	for _, l := range links {
		seen = append(seen, l.Attrs().Name+"="+l.Attrs().HardwareAddr.String())
		if bytes.Equal(l.Attrs().HardwareAddr, mac) {
			nic = l
		}
	}
	if nic == nil {
		return fmt.Errorf("%s: no NIC with MAC %s in the VM (links: %s); is the NIC driver module loaded?", n.Name, mac, strings.Join(seen, " "))
	}
	if err := netlink.LinkSetName(nic, "mgmt0"); err != nil {
		return fmt.Errorf("%s: rename %s: %w", n.Name, nic.Attrs().Name, err)
	}
	if err := netlink.LinkSetNsFd(nic, int(n.netns.Fd())); err != nil {
		return fmt.Errorf("%s: move NIC: %w", n.Name, err)
	}
	return n.netns.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName("mgmt0")
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(vmconf.GuestMgmtIP), Mask: net.CIDRMask(24, 32)}}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		def := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(vmconf.APIServerHostIP)}
		if err := netlink.RouteAdd(def); err != nil {
			return fmt.Errorf("default route: %w", err)
		}
		return nil
	})
}

// apiClient is an HTTPS client whose connections start in netns from.
func (g *guest) apiClient(from ns.NetNS) (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(g.cfg.CAPEM)) {
		return nil, errors.New("no CA certificate in the config")
	}
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext:     nettest.DialIn(from),
			TLSClientConfig: &tls.Config{RootCAs: pool},
		},
	}, nil
}

// apiCall sends an admin request to the API server from netns from.
func (g *guest) apiCall(from ns.NetNS, method, path string) (int, []byte, error) {
	c, err := g.apiClient(from)
	if err != nil {
		return 0, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, g.cfg.APIServer+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+g.cfg.AdminToken)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// checkAPI proves, before podnet-routed needs it, that every node reaches
// the host's API server through its QEMU NIC and trusts its certificate.
func (g *guest) checkAPI() error {
	for _, n := range g.nodes {
		var body []byte
		start := time.Now()
		err := waitFor(15*time.Second, func() error {
			code, b, err := g.apiCall(n.netns, http.MethodGet, "/version")
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("GET /version: HTTP %d: %s", code, b)
			}
			body = b
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s cannot reach the API server %s through QEMU user networking: %w", n.Name, g.cfg.APIServer, err)
		}
		var v struct {
			GitVersion string `json:"gitVersion"`
		}
		_ = json.Unmarshal(body, &v)
		g.logf("%s: API server %s (kube-apiserver %s) answers after %s", n.Name, g.cfg.APIServer, v.GitVersion, time.Since(start).Round(time.Millisecond))
	}
	return nil
}
