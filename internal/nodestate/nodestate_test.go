package nodestate

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestCheckPodCIDR(t *testing.T) {
	for _, tc := range []struct {
		cidr string
		want string // "" accepted, else a substring of the error
	}{
		{"10.244.1.0/24", ""},
		{"10.0.0.0/8", ""},
		{"192.168.0.0/16", ""},
		{"192.0.2.0/30", ""},
		{"10.244.1.77/24", ""}, // host bits are masked off, as host-local does
		{"fd00:10:244:1::/64", ""},
		{"fd00::/48", ""},
		{"2001:db8::/120", ""},
		{"fd00::/126", ""},

		{"0.0.0.0/0", "far too large"},
		{"0.0.0.0/4", "far too large"},
		{"10.0.0.0/7", "/8 or longer"},
		{"::/0", "far too large"},
		{"fd00::/47", "/48 or longer"},
		{"0.0.0.0/8", `"this network" range`},
		{"0.0.0.0/24", `"this network" range`},
		{"127.0.0.0/24", "loopback range 127.0.0.0/8"},
		{"127.0.0.1/32", "loopback"},
		{"169.254.0.0/24", "link-local range 169.254.0.0/16"},
		{"224.0.0.0/24", "multicast range 224.0.0.0/4"},
		{"239.1.0.0/16", "multicast"},
		{"240.0.0.0/24", "reserved range"},
		{"255.255.255.0/24", "reserved range"},
		{"::/64", "unspecified address ::/128"},
		{"::1/128", "loopback address ::1/128"},
		{"::ffff:10.0.0.0/120", "IPv4-mapped"},
		{"fe80::/64", "link-local range fe80::/10"},
		{"ff02::/64", "multicast range ff00::/8"},
		{"10.0.0.0/31", "too small"},
		{"10.0.0.1/32", "too small"},
		{"fd00::/127", "too small"},
	} {
		err := CheckPodCIDR(netip.MustParsePrefix(tc.cidr))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckPodCIDR(%s) = %v, want nil", tc.cidr, err)
		case tc.want != "" && err == nil:
			t.Errorf("CheckPodCIDR(%s) = nil, want an error containing %q", tc.cidr, tc.want)
		case tc.want != "" && (!errors.Is(err, ErrBadPodCIDR) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckPodCIDR(%s) = %v, want an ErrBadPodCIDR error containing %q", tc.cidr, err, tc.want)
		}
	}
	if err := CheckPodCIDR(netip.Prefix{}); !errors.Is(err, ErrBadPodCIDR) {
		t.Errorf("CheckPodCIDR(zero prefix) = %v, want ErrBadPodCIDR", err)
	}
}

func TestPodCIDRPrefixes(t *testing.T) {
	s := &State{PodCIDRs: []string{"10.244.1.77/24", "fd00:10:244:1::/64"}}
	got, err := s.PodCIDRPrefixes()
	want := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("PodCIDRPrefixes = %v, %v; want %v (masked)", got, err, want)
	}
	if got, err := (&State{}).PodCIDRPrefixes(); err != nil || len(got) != 0 {
		t.Fatalf("no PodCIDRs: %v, %v", got, err)
	}
	// One bad entry refuses the whole list, quoting the entry.
	for _, bad := range []string{"0.0.0.0/0", "not a cidr", "10.0.0.0/33", "fe80::/64%eth0"} {
		s := &State{PodCIDRs: []string{"10.244.1.0/24", bad}}
		got, err := s.PodCIDRPrefixes()
		if !errors.Is(err, ErrBadPodCIDR) || !strings.Contains(err.Error(), strconv.Quote(bad)) || got != nil {
			t.Errorf("PodCIDRPrefixes(%q) = %v, %v; want ErrBadPodCIDR quoting the value", bad, got, err)
		}
	}
}

func TestReadWrite(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), Path(dir)) {
		t.Fatalf("Read without a file = %v, want ErrNotReady naming %s", err, Path(dir))
	}
	want := &State{NodeName: "n1", PodCIDRs: []string{"10.244.1.0/24", "fd00:10:244:1::/64"}, MTU: 1450, Encap: "vxlan"}
	if err := Write(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(dir)
	if err != nil || got.NodeName != want.NodeName || !slices.Equal(got.PodCIDRs, want.PodCIDRs) || got.MTU != want.MTU || got.Encap != want.Encap {
		t.Fatalf("Read after Write = %+v, %v; want %+v", got, err, want)
	}
	if err := os.WriteFile(Path(dir), []byte(`{"podCIDRs":["10.244.1.0/24"`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err == nil || errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), Path(dir)) {
		t.Fatalf("Read of a truncated file = %v, want a parse error naming %s", err, Path(dir))
	}
	// Read parses only: an absurd PodCIDR is for PodCIDRPrefixes to refuse,
	// so that the MTU stays readable.
	if err := os.WriteFile(Path(dir), []byte(`{"podCIDRs":["0.0.0.0/0"],"mtu":1400}`), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := Read(dir)
	if err != nil || st.MTU != 1400 {
		t.Fatalf("Read with an absurd PodCIDR = %+v, %v", st, err)
	}
	if _, err := st.PodCIDRPrefixes(); !errors.Is(err, ErrBadPodCIDR) || !strings.Contains(err.Error(), `"0.0.0.0/0"`) {
		t.Fatalf("PodCIDRPrefixes of 0.0.0.0/0 = %v", err)
	}
	if err := Remove(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, FileName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Remove left the file: %v", err)
	}
	if err := Remove(dir); err != nil {
		t.Fatalf("Remove of a missing file: %v", err)
	}
}

// FuzzParse feeds arbitrary node.json contents to Parse and
// PodCIDRPrefixes: no panic, accepted PodCIDRs are usable pod ranges, every
// refusal wraps ErrBadPodCIDR and quotes an entry of the file, and what
// Parse accepts survives an encode/decode round trip. The seeds run in
// every go test.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"nodeName":"node-1","podCIDRs":["10.244.1.0/24","fd00:10:244:1::/64"],"mtu":1450,"encap":"vxlan"}`,
		`{"podCIDRs":["10.244.1.0/24"]}`,
		`{"podCIDRs":["10.244.1.77/24"]}`,
		`{"podCIDRs":["fd00::/48"],"mtu":1280,"encap":"none"}`,
		`{"mtu":1500}`,
		`{}`,
		`{"podCIDRs":["0.0.0.0/0"]}`,
		`{"podCIDRs":["0.0.0.0/4"]}`,
		`{"podCIDRs":["10.0.0.0/7"]}`,
		`{"podCIDRs":["127.0.0.0/24"]}`,
		`{"podCIDRs":["169.254.0.0/24"]}`,
		`{"podCIDRs":["224.0.0.0/24"]}`,
		`{"podCIDRs":["240.0.0.0/24"]}`,
		`{"podCIDRs":["10.0.0.0/31"]}`,
		`{"podCIDRs":["::/0"]}`,
		`{"podCIDRs":["::/64"]}`,
		`{"podCIDRs":["fd00::/47"]}`,
		`{"podCIDRs":["fe80::/64"]}`,
		`{"podCIDRs":["ff02::/64"]}`,
		`{"podCIDRs":["::ffff:10.0.0.0/120"]}`,
		`{"podCIDRs":["10.244.1.0/24","0.0.0.0/0"]}`,
		`{"podCIDRs":["not a cidr"]}`,
		`{"podCIDRs":["fe80::/64%eth0"]}`,
		`{"podCIDRs":"10.244.1.0/24"}`,
		`{"podCIDRs":[null]}`,
		`{"mtu":-1}`,
		`{"mtu":1e100}`,
		`{"podCIDRs":["10.244.1.0/24"]`,
		`{"podCIDRs":["10.244.1.0/24"]} {}`,
		`null`,
		`[]`,
		``,
		"\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if s != nil {
				t.Fatalf("Parse(%q) returned a state with the error %v", data, err)
			}
			return
		}
		prefixes, err := s.PodCIDRPrefixes()
		if err != nil {
			if !errors.Is(err, ErrBadPodCIDR) {
				t.Fatalf("Parse(%q): PodCIDRPrefixes error %v does not wrap ErrBadPodCIDR", data, err)
			}
			quoted := false
			for _, c := range s.PodCIDRs {
				quoted = quoted || strings.Contains(err.Error(), strconv.Quote(c))
			}
			if !quoted {
				t.Fatalf("Parse(%q): PodCIDRPrefixes error %q quotes no entry of %q", data, err, s.PodCIDRs)
			}
		} else {
			if len(prefixes) != len(s.PodCIDRs) {
				t.Fatalf("Parse(%q): %d prefixes for %d PodCIDRs", data, len(prefixes), len(s.PodCIDRs))
			}
			for _, p := range prefixes {
				shortest, longest := MinPodCIDRBitsV4, MaxPodCIDRBitsV4
				if p.Addr().Is6() {
					shortest, longest = MinPodCIDRBitsV6, MaxPodCIDRBitsV6
				}
				if !p.IsValid() || p != p.Masked() || p.Bits() < shortest || p.Bits() > longest || p.Addr().Is4In6() || p.Addr().Zone() != "" {
					t.Fatalf("Parse(%q): accepted PodCIDR %v", data, p)
				}
				for _, sp := range specialRanges {
					if sp.prefix.Overlaps(p) {
						t.Fatalf("Parse(%q): accepted PodCIDR %v overlaps %v", data, p, sp.prefix)
					}
				}
				// Its first addresses (gateway, first pod) are real unicast ones.
				for a, i := p.Addr().Next(), 0; i < 2; a, i = a.Next(), i+1 {
					if !a.IsGlobalUnicast() {
						t.Fatalf("Parse(%q): accepted PodCIDR %v would hand out %v", data, p, a)
					}
				}
			}
		}
		// What Parse accepts survives an encode/decode round trip.
		enc, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("Parse(%q): the state does not encode: %v", data, err)
		}
		again, err := Parse(enc)
		if err != nil {
			t.Fatalf("Parse(%q): its encoding %s does not parse: %v", data, enc, err)
		}
		enc2, err := json.Marshal(again)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("Parse(%q): round trip %s -> %s (%v)", data, enc, enc2, err)
		}
	})
}
