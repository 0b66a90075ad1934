// Command fakeipam is a test-only IPAM plugin: it hands out the addresses
// written in its config, records every verb it is called with, and fails on
// demand. The podnet tests use it to prove which IPAM calls a plugin makes
// and how IPAM failures surface.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

type failure struct {
	Code uint   `json:"code"`
	Msg  string `json:"msg"`
}

type config struct {
	CNIVersion string `json:"cniVersion"`
	IPAM       struct {
		IPs    []string            `json:"ips"`
		Routes []*types.Route      `json:"routes"`
		Log    string              `json:"log"`
		Fail   map[string]*failure `json:"fail"`
	} `json:"ipam"`
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    func(a *skel.CmdArgs) error { return run("ADD", a) },
		Del:    func(a *skel.CmdArgs) error { return run("DEL", a) },
		Check:  func(a *skel.CmdArgs) error { return run("CHECK", a) },
		GC:     func(a *skel.CmdArgs) error { return run("GC", a) },
		Status: func(a *skel.CmdArgs) error { return run("STATUS", a) },
	}, version.All, "fakeipam: test IPAM")
}

func run(verb string, args *skel.CmdArgs) error {
	var c config
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return err
	}
	if c.IPAM.Log != "" {
		f, err := os.OpenFile(c.IPAM.Log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		fmt.Fprintf(f, "%s %s %s\n", verb, args.ContainerID, args.IfName)
		f.Close()
	}
	if f := c.IPAM.Fail[verb]; f != nil {
		return types.NewError(f.Code, f.Msg, "")
	}
	if verb != "ADD" {
		return nil
	}
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: c.IPAM.Routes}
	for _, s := range c.IPAM.IPs {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			return err
		}
		n.IP = ip
		res.IPs = append(res.IPs, &current.IPConfig{Address: *n})
	}
	return types.PrintResult(res, c.CNIVersion)
}
