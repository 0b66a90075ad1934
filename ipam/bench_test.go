package ipam

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// The ADD+DEL benchmark runs the public verbs in-process against a /16 that
// is pre-filled to a given occupancy with randomly scattered reservations
// (the realistic worst case for the free-address search: the free addresses
// are spread over the whole range instead of sitting after the cursor). The
// cost of one ADD+DEL should not depend on the occupancy. `make bench` runs
// it together with the exec comparison against host-local
// (scripts/bench-ipam.sh); nothing here is asserted by `make test`.

const (
	benchSubnet  = "10.128.0.0/16"
	benchNetwork = "bench"
)

// benchDataRoot returns a tmpfs directory for the store when one is
// writable (/dev/shm, then /run: the plugin's default dataDir is on tmpfs
// too), else the benchmark's temp dir. The second result names the choice.
func benchDataRoot(b *testing.B) (string, string) {
	for _, dir := range []string{"/dev/shm", "/run"} {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
			continue
		}
		d, err := os.MkdirTemp(dir, "podnet-ipam-bench-")
		if err != nil {
			continue
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		return d, "tmpfs " + dir
	}
	return b.TempDir(), "b.TempDir (not tmpfs)"
}

func benchConf(dataDir string) []byte {
	return fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":%q,"ipam":{"type":%q,"subnet":%q,"dataDir":%q}}`,
		benchNetwork, PluginType, benchSubnet, dataDir)
}

// benchPrefill reserves count randomly chosen addresses of the benchmark
// range through store.Disk and the allocator (one open store, requested
// addresses), which is what count ADDs with CNI_ARGS IP=<addr> would leave
// on disk (reservations, owner index, hint bitmap) without reopening the
// store and re-parsing the config count times.
func benchPrefill(b *testing.B, conf []byte, count int) {
	plan, err := ParseConfig(conf, "", nil)
	if err != nil {
		b.Fatal(err)
	}
	disk, err := store.OpenDisk(plan.DataDir, plan.Conf.Name)
	if err != nil {
		b.Fatal(err)
	}
	defer disk.Close()
	a := &allocator.Allocator{Sets: plan.Sets, Exclude: plan.Exclude, Store: disk}
	r := plan.Sets[0][0]
	var candidates []netip.Addr
	for off := uint64(0); off < r.Size(); off++ {
		if ip := r.At(off); ip != r.Gateway {
			candidates = append(candidates, ip)
		}
	}
	if count > len(candidates) {
		b.Fatalf("cannot pre-fill %d of %d addresses", count, len(candidates))
	}
	rng := rand.New(rand.NewPCG(1, 2)) // same scatter on every run
	rng.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	for i, ip := range candidates[:count] {
		o := allocator.Owner{ContainerID: "prefill-" + strconv.Itoa(i), IfName: "eth0"}
		if _, err := a.Allocate(o, []netip.Addr{ip}); err != nil {
			b.Fatalf("pre-fill %s: %v", ip, err)
		}
	}
}

// BenchmarkAddDel measures one ADD (new container ID) plus the DEL of it
// through ipam.Add/ipam.Del on a /16 at 0 %, 50 % and 99 % occupancy.
func BenchmarkAddDel(b *testing.B) {
	prefix := netip.MustParsePrefix(benchSubnet)
	usable := 1<<(32-prefix.Bits()) - 3 // minus network, broadcast and gateway
	for _, pct := range []int{0, 50, 99} {
		b.Run(fmt.Sprintf("occupancy=%d%%", pct), func(b *testing.B) {
			root, where := benchDataRoot(b)
			conf := benchConf(root)
			count := usable * pct / 100
			start := time.Now()
			benchPrefill(b, conf, count)
			b.Logf("dataDir on %s; pre-filled %d of %d usable addresses (random) in %v",
				where, count, usable, time.Since(start).Round(time.Millisecond))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req := Request{Stdin: conf, ContainerID: "bench-" + strconv.Itoa(i), IfName: "eth0"}
				i++
				res, err := Add(req)
				if err != nil {
					b.Fatal(err)
				}
				if len(res.IPs) != 1 {
					b.Fatalf("ADD returned %d addresses, want 1", len(res.IPs))
				}
				if err := Del(req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(count), "prefilled")
			// Every DEL released its ADD: the occupancy stayed put.
			ents, err := os.ReadDir(filepath.Join(root, benchNetwork, "ips"))
			if err != nil {
				b.Fatal(err)
			}
			if len(ents) != count {
				b.Fatalf("%d reservations after the run, want %d", len(ents), count)
			}
		})
	}
}
