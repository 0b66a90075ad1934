package nettest

// The plugins' pod filter (nftables table contract.PodFilterTable, family
// inet for podnet and bridge for podnet-bridge), read with the nftables
// library from a netns.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
)

// PodFilterFamilies are the families of the pod filter's table: inet
// (podnet) and bridge (podnet-bridge).
var PodFilterFamilies = []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge}

// PodFilterElement is one element of the pod filter's sets.
type PodFilterElement struct {
	Family nftables.TableFamily
	Set    string // ports, addrs4, addrs6, macs
	Index  int    // the host veth's ifindex
	Value  string // the address or MAC ("" in ports)
}

func (e PodFilterElement) String() string {
	fam := "inet"
	if e.Family == nftables.TableFamilyBridge {
		fam = "bridge"
	}
	if e.Value == "" {
		return fmt.Sprintf("%s/%s %d", fam, e.Set, e.Index)
	}
	return fmt.Sprintf("%s/%s %d . %s", fam, e.Set, e.Index, e.Value)
}

// nftIn opens an nftables connection to netns.
func nftIn(netns ns.NetNS) (*nftables.Conn, error) {
	return nftables.New(nftables.WithNetNSFd(int(netns.Fd())))
}

func notFound(err error) bool {
	// the nftables library flattens some errors into text (%v)
	return errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), unix.ENOENT.Error())
}

// ReadPodFilter lists every element of the pod filter's sets in netns, both
// families (a missing table or set holds none).
func ReadPodFilter(netns ns.NetNS) ([]PodFilterElement, error) {
	c, err := nftIn(netns)
	if err != nil {
		return nil, err
	}
	var out []PodFilterElement
	for _, fam := range PodFilterFamilies {
		t := &nftables.Table{Family: fam, Name: contract.PodFilterTable}
		for _, name := range []string{"ports", "addrs4", "addrs6", "macs"} {
			elems, err := c.GetSetElements(&nftables.Set{Table: t, Name: name})
			if err != nil {
				if notFound(err) {
					continue
				}
				return nil, fmt.Errorf("list set %s/%s: %w", t.Name, name, err)
			}
			for _, e := range elems {
				if len(e.Key) < 4 {
					return nil, fmt.Errorf("set %s/%s: key %x too short", t.Name, name, e.Key)
				}
				el := PodFilterElement{Family: fam, Set: name, Index: int(binary.NativeEndian.Uint32(e.Key))}
				switch name {
				case "addrs4", "addrs6":
					el.Value = net.IP(e.Key[4:]).String()
				case "macs":
					el.Value = net.HardwareAddr(e.Key[4:10]).String()
				}
				out = append(out, el)
			}
		}
	}
	slices.SortFunc(out, func(a, b PodFilterElement) int {
		if a.String() < b.String() {
			return -1
		}
		if a.String() > b.String() {
			return 1
		}
		return 0
	})
	return out, nil
}

// PodFilterElements is ReadPodFilter as strings (PodFilterElement.String).
func PodFilterElements(netns ns.NetNS) ([]string, error) {
	elems, err := ReadPodFilter(netns)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(elems))
	for _, e := range elems {
		out = append(out, e.String())
	}
	return out, nil
}

// podFilterTables are the pod filter's tables of family fam: the routed
// mode's netdev ones (contract.PodFilterL2Table), else the one of its
// family.
func podFilterTables(fam nftables.TableFamily) []*nftables.Table {
	if fam != nftables.TableFamilyNetdev {
		return []*nftables.Table{{Family: fam, Name: contract.PodFilterTable}}
	}
	var out []*nftables.Table
	for k := range contract.PodFilterL2Tables {
		out = append(out, &nftables.Table{Family: fam, Name: contract.PodFilterL2Table(k)})
	}
	return out
}

// PodFilterCounter reads the packets of the named counter object (e.g.
// contract.PodFilterSpoofedCounter) of the pod filter of family fam in
// netns (the routed mode's netdev tables summed): 0 when there is no such
// table or counter (nothing was counted).
func PodFilterCounter(netns ns.NetNS, fam nftables.TableFamily, name string) (uint64, error) {
	c, err := nftIn(netns)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, t := range podFilterTables(fam) {
		obj, err := c.GetObject(&nftables.NamedObj{Table: t, Name: name, Type: nftables.ObjTypeCounter})
		if err != nil {
			if notFound(err) {
				continue
			}
			return 0, fmt.Errorf("counter %s of table %s: %w", name, t.Name, err)
		}
		if obj == nil {
			continue
		}
		named, ok := obj.(*nftables.NamedObj)
		if !ok {
			return 0, fmt.Errorf("counter %s of table %s: got %T", name, t.Name, obj)
		}
		ctr, ok := named.Obj.(*expr.Counter)
		if !ok {
			return 0, fmt.Errorf("counter %s of table %s: object holds %T", name, t.Name, named.Obj)
		}
		sum += ctr.Packets
	}
	return sum, nil
}
