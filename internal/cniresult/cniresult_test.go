package cniresult

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// libraryPrint is what types.PrintResult prints for r as version.
func libraryPrint(t *testing.T, r *current.Result, version string) ([]byte, error) {
	t.Helper()
	res, err := r.GetAsVersion(version)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	err = res.(interface{ PrintTo(io.Writer) error }).PrintTo(&buf)
	return buf.Bytes(), err
}

// TestPrintIsTheLibrarys: Print writes exactly the bytes the
// CNI library's PrintResult writes, for the results podnet makes and for
// random chained ones (prevResult content: any interface, route and DNS
// field, strings that need escaping, numbers at the edges), at every
// version; the fast path must take podnet's own results.
func TestPrintIsTheLibrarys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	strs := []string{"", "eth0", "/var/run/netns/cni-1234", "a<b>&c", "quote\"back\\slash", "tab\tnl\nnul\x00", "\u2028\u2029", "ünï©ødé", "bad\xffutf8", "0000:00:1f.6"}
	// benign: no value the fast path leaves to the library (invalid UTF-8,
	// a number beyond 2^53, an IP of a wrong length, a nil entry)
	benign := false
	pick := func() string {
		for {
			if s := strs[rng.IntN(len(strs))]; !benign || s != "bad\xffutf8" {
				return s
			}
		}
	}
	ints := []int{0, 1, -1, 1500, 9000, 1 << 31, 1<<53 - 1, 1 << 53, -(1 << 53), 1<<53 + 1, -(1<<53 + 1), 1 << 62}
	num := func() int {
		if benign {
			return ints[rng.IntN(7)]
		}
		return ints[rng.IntN(len(ints))]
	}
	ipnet := func() net.IPNet {
		switch rng.IntN(4) {
		case 0:
			return net.IPNet{IP: net.IPv4(10, 244, byte(rng.IntN(256)), byte(rng.IntN(256))).To4(), Mask: net.CIDRMask(32, 32)}
		case 1:
			return net.IPNet{IP: net.ParseIP("fd00::1234"), Mask: net.CIDRMask(128, 128)}
		case 2:
			return net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		}
		return net.IPNet{}
	}
	ip := func() net.IP {
		switch rng.IntN(5) {
		case 0:
			return nil
		case 3:
			if benign {
				return net.ParseIP("fd00::1")
			}
			return net.IP{1, 2, 3} // a length net.IP refuses
		case 1:
			return net.IPv4(169, 254, 1, 1)
		case 2:
			return net.ParseIP("fe80::1")
		}
		return net.IPv4(10, 0, 0, 1).To4()
	}
	random := func() *current.Result {
		r := &current.Result{CNIVersion: current.ImplementedSpecVersion}
		for range rng.IntN(3) {
			if !benign && rng.IntN(20) == 0 {
				r.Interfaces = append(r.Interfaces, nil)
				continue
			}
			r.Interfaces = append(r.Interfaces, &current.Interface{Name: pick(), Mac: pick(), Mtu: num(), Sandbox: pick(), SocketPath: pick(), PciID: pick()})
		}
		for range rng.IntN(3) {
			c := &current.IPConfig{Address: ipnet(), Gateway: ip()}
			if rng.IntN(2) == 0 {
				c.Interface = current.Int(num())
			}
			r.IPs = append(r.IPs, c)
		}
		for range rng.IntN(3) {
			rt := &types.Route{Dst: ipnet(), GW: ip(), MTU: num(), AdvMSS: num(), Priority: num()}
			if rng.IntN(2) == 0 {
				rt.Table = current.Int(num())
			}
			if rng.IntN(2) == 0 {
				rt.Scope = current.Int(num())
			}
			r.Routes = append(r.Routes, rt)
		}
		if rng.IntN(2) == 0 {
			r.DNS = types.DNS{Domain: pick()}
			if rng.IntN(2) == 0 {
				r.DNS.Nameservers = []string{pick(), pick()}
			}
			if rng.IntN(2) == 0 {
				r.DNS.Search = []string{pick()}
			}
			if rng.IntN(2) == 0 {
				r.DNS.Options = []string{pick()}
			}
		}
		if rng.IntN(10) == 0 {
			r.Interfaces, r.IPs = []*current.Interface{}, []*current.IPConfig{}
		}
		return r
	}
	// podnet's own result: the fast path must take it
	own := &current.Result{CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: "cali1234567890a"}, {Name: "eth0", Mac: "02:42:ac:11:00:02", Mtu: 1450, Sandbox: "/var/run/netns/cni-1"}},
		IPs: []*current.IPConfig{
			{Interface: current.Int(1), Address: net.IPNet{IP: net.IPv4(10, 244, 1, 5).To4(), Mask: net.CIDRMask(32, 32)}, Gateway: net.IPv4(169, 254, 1, 1)},
			{Interface: current.Int(1), Address: net.IPNet{IP: net.ParseIP("fd00:10:244:1::5"), Mask: net.CIDRMask(128, 128)}, Gateway: net.ParseIP("fe80::1")}},
		Routes: []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: net.IPv4(169, 254, 1, 1)}},
		DNS:    types.DNS{Nameservers: []string{"10.96.0.10"}, Search: []string{"svc.cluster.local"}, Options: []string{"ndots:5"}}}
	for _, v := range []string{"1.0.0", "1.1.0"} {
		if _, ok := encodeResult(own, v); !ok {
			t.Fatalf("version %s: podnet's own result does not take the fast path", v)
		}
	}
	cases := []*current.Result{own, {CNIVersion: current.ImplementedSpecVersion}}
	for range 2000 {
		cases = append(cases, random())
	}
	benign = true
	for range 1000 {
		r := random()
		for _, v := range []string{"1.0.0", "1.1.0"} {
			if _, ok := encodeResult(r, v); !ok {
				t.Fatalf("version %s: %+v does not take the fast path", v, r)
			}
		}
		cases = append(cases, r)
	}
	for i, r := range cases {
		for _, v := range []string{"1.0.0", "1.1.0", "0.4.0", "0.3.1", "0.2.0", "9.9.9"} {
			if !v1(v) && hasNil(r) {
				continue // the library's conversion to 0.x panics on a nil entry
			}
			want, wantErr := libraryPrint(t, r, v)
			var got bytes.Buffer
			gotErr := Print(&got, r, v)
			if (wantErr == nil) != (gotErr == nil) || !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("case %d, version %s:\n got %q (err %v)\nwant %q (err %v)", i, v, got.Bytes(), gotErr, want, wantErr)
			}
		}
	}
}

func v1(v string) bool { return v == "1.0.0" || v == "1.1.0" }

func hasNil(r *current.Result) bool {
	for _, i := range r.Interfaces {
		if i == nil {
			return true
		}
	}
	return false
}

// BenchmarkPrintResult: the library's PrintResult against Print,
// for podnet's result of a dual-stack pod.
func BenchmarkPrintResult(b *testing.B) {
	r := &current.Result{CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: "cali1234567890a"}, {Name: "eth0", Mac: "02:42:ac:11:00:02", Mtu: 1450, Sandbox: "/var/run/netns/cni-1"}},
		IPs:        []*current.IPConfig{{Interface: current.Int(1), Address: net.IPNet{IP: net.IPv4(10, 244, 1, 5).To4(), Mask: net.CIDRMask(32, 32)}, Gateway: net.IPv4(169, 254, 1, 1)}},
		Routes:     []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: net.IPv4(169, 254, 1, 1)}}}
	b.Run("library", func(b *testing.B) {
		for b.Loop() {
			res, _ := r.GetAsVersion("1.0.0")
			_ = res.(interface{ PrintTo(io.Writer) error }).PrintTo(io.Discard)
		}
	})
	b.Run("podnet", func(b *testing.B) {
		for b.Loop() {
			_ = Print(io.Discard, r, "1.0.0")
		}
	})
}
