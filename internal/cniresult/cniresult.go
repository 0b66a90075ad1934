// Package cniresult prints CNI results as the CNI library does, byte for
// byte, without its reflection: a plugin process pays encoding/json's
// first use on every ADD.
package cniresult

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Print writes result, as CNI version version, to w: the bytes
// types.PrintResult prints to stdout. For versions 1.0.0 and 1.1.0 they are built
// here without reflection. The library marshals the result, decodes it
// into maps, marshals those (every object's keys sorted) and indents
// that: about 0.2 ms of a plugin process's first use of encoding/json,
// on every ADD. Anything this encoder does not know exactly (an older
// version, a nil entry, a number a float64 would round) goes the
// library's way.
func Print(w io.Writer, result *current.Result, version string) error {
	if data, ok := encodeResult(result, version); ok {
		_, err := w.Write(data)
		return err
	}
	r, err := result.GetAsVersion(version)
	if err != nil {
		return err
	}
	return r.(interface{ PrintTo(io.Writer) error }).PrintTo(w)
}

// encodeResult is result as version in the library's layout (ok false:
// not handled here).
func encodeResult(r *current.Result, version string) ([]byte, bool) {
	if version != "1.0.0" && version != "1.1.0" {
		return nil, false
	}
	e := &resultEncoder{}
	b := append(make([]byte, 0, 512), '{')
	b = e.key(b, "cniVersion", true)
	b = e.str(b, version)
	if !dnsEmpty(r.DNS) {
		b = e.key(b, "dns", false)
		b = e.dns(b, r.DNS)
	}
	if len(r.Interfaces) > 0 {
		b = list(e, b, "interfaces", r.Interfaces, e.iface)
	}
	if len(r.IPs) > 0 {
		b = list(e, b, "ips", r.IPs, e.ipConfig)
	}
	if len(r.Routes) > 0 {
		b = list(e, b, "routes", r.Routes, e.route)
	}
	b = append(b, '}')
	if e.bad {
		return nil, false
	}
	var out bytes.Buffer
	out.Grow(2 * len(b))
	if json.Indent(&out, b, "", "    ") != nil {
		return nil, false
	}
	return out.Bytes(), true
}

// list appends "key":[...] with each item written by enc; a nil item is
// left to the library (bad).
func list[T any](e *resultEncoder, b []byte, key string, items []*T, enc func([]byte, *T) []byte) []byte {
	b = append(e.key(b, key, false), '[')
	for i, it := range items {
		if it == nil {
			e.bad = true
			return b
		}
		b = enc(e.comma(b, i == 0), it)
	}
	return append(b, ']')
}

// resultEncoder appends compact JSON; bad records a value it cannot
// write as the library would.
type resultEncoder struct{ bad bool }

func (e *resultEncoder) comma(b []byte, first bool) []byte {
	if first {
		return b
	}
	return append(b, ',')
}

// key appends "name": (after a comma unless first).
func (e *resultEncoder) key(b []byte, name string, first bool) []byte {
	b = e.comma(b, first)
	b = e.str(b, name)
	return append(b, ':')
}

// str appends s as encoding/json writes a string (HTML-safe escapes). A
// string that is not valid UTF-8 is left to the library, whose second
// pass writes the U+FFFD its first wrote as an escape.
func (e *resultEncoder) str(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		e.bad = true
		return b
	}
	q, err := json.Marshal(s)
	if err != nil {
		e.bad = true
		return b
	}
	return append(b, q...)
}

// num appends n as the library writes it: decoded into a float64 and
// encoded again, which is n itself for |n| < 2^53.
func (e *resultEncoder) num(b []byte, n int) []byte {
	if n >= 1<<53 || n <= -(1<<53) {
		e.bad = true
		return b
	}
	return strconv.AppendInt(b, int64(n), 10)
}

// ip appends an IP as net.IP's MarshalText does (a length it refuses is
// left to the library, which fails on it).
func (e *resultEncoder) ip(b []byte, ip net.IP) []byte {
	if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
		e.bad = true
		return b
	}
	return e.str(b, ip.String())
}

func dnsEmpty(d types.DNS) bool {
	return len(d.Nameservers) == 0 && d.Domain == "" && len(d.Search) == 0 && len(d.Options) == 0
}

func (e *resultEncoder) strs(b []byte, list []string) []byte {
	b = append(b, '[')
	for i, s := range list {
		b = e.comma(b, i == 0)
		b = e.str(b, s)
	}
	return append(b, ']')
}

// dns: domain, nameservers, options, search (sorted; empty ones left out).
func (e *resultEncoder) dns(b []byte, d types.DNS) []byte {
	b = append(b, '{')
	first := true
	if d.Domain != "" {
		b, first = e.str(e.key(b, "domain", first), d.Domain), false
	}
	if len(d.Nameservers) > 0 {
		b, first = e.strs(e.key(b, "nameservers", first), d.Nameservers), false
	}
	if len(d.Options) > 0 {
		b, first = e.strs(e.key(b, "options", first), d.Options), false
	}
	if len(d.Search) > 0 {
		b = e.strs(e.key(b, "search", first), d.Search)
	}
	return append(b, '}')
}

// iface: mac, mtu, name, pciID, sandbox, socketPath (sorted; name always).
func (e *resultEncoder) iface(b []byte, i *current.Interface) []byte {
	b = append(b, '{')
	first := true
	if i.Mac != "" {
		b, first = e.str(e.key(b, "mac", first), i.Mac), false
	}
	if i.Mtu != 0 {
		b, first = e.num(e.key(b, "mtu", first), i.Mtu), false
	}
	b = e.str(e.key(b, "name", first), i.Name)
	if i.PciID != "" {
		b = e.str(e.key(b, "pciID", false), i.PciID)
	}
	if i.Sandbox != "" {
		b = e.str(e.key(b, "sandbox", false), i.Sandbox)
	}
	if i.SocketPath != "" {
		b = e.str(e.key(b, "socketPath", false), i.SocketPath)
	}
	return append(b, '}')
}

// ipConfig: address, gateway, interface (sorted; address always).
func (e *resultEncoder) ipConfig(b []byte, c *current.IPConfig) []byte {
	b = append(b, '{')
	b = e.str(e.key(b, "address", true), c.Address.String())
	if len(c.Gateway) > 0 {
		b = e.ip(e.key(b, "gateway", false), c.Gateway)
	}
	if c.Interface != nil {
		b = e.num(e.key(b, "interface", false), *c.Interface)
	}
	return append(b, '}')
}

// route: advmss, dst, gw, mtu, priority, scope, table (sorted; dst always).
func (e *resultEncoder) route(b []byte, r *types.Route) []byte {
	b = append(b, '{')
	first := true
	if r.AdvMSS != 0 {
		b, first = e.num(e.key(b, "advmss", first), r.AdvMSS), false
	}
	b = e.str(e.key(b, "dst", first), r.Dst.String())
	if len(r.GW) > 0 {
		b = e.ip(e.key(b, "gw", false), r.GW)
	}
	if r.MTU != 0 {
		b = e.num(e.key(b, "mtu", false), r.MTU)
	}
	if r.Priority != 0 {
		b = e.num(e.key(b, "priority", false), r.Priority)
	}
	if r.Scope != nil {
		b = e.num(e.key(b, "scope", false), *r.Scope)
	}
	if r.Table != nil {
		b = e.num(e.key(b, "table", false), *r.Table)
	}
	return append(b, '}')
}
