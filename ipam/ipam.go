package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/utils"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/internal/threadprio"
	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

// Request is one invocation: the network config on stdin and the CNI
// environment.
type Request struct {
	Stdin       []byte
	ContainerID string
	IfName      string
	Args        string // CNI_ARGS
	Netns       string // CNI_NETNS (recorded at ADD)
}

// RequestFrom builds a Request from a plugin invocation.
func RequestFrom(a *skel.CmdArgs) Request {
	return Request{Stdin: a.StdinData, ContainerID: a.ContainerID, IfName: a.IfName, Args: a.Args, Netns: a.Netns}
}

// session is an open, locked store with the allocator over it.
type session struct {
	plan  *Plan
	disk  *store.Disk
	alloc *allocator.Allocator
}

// nodeAddrs lists the node's own addresses: those of the netns podnet-ipam
// runs in (the node's, for a CNI plugin). Unit tests replace it.
var nodeAddrs NodeAddrSource = nodestate.LocalAddrs

// open parses the config and opens the locked store. An unknown PodCIDR
// comes back as an error wrapping ErrPodCIDRUnknown (see openError). For
// the verbs that hand out addresses (ADD, and STATUS which tells whether
// ADD can) handsOut also refuses ranges that hold an address of the node
// (Plan.CheckNodeAddrs); DEL, CHECK and GC only look up reservations.
func open(req Request, handsOut bool) (*session, error) {
	dir := stateDir(req.Stdin)
	source := NodeStatePodCIDRs(dir)
	if !handsOut {
		source = NodeStatePodCIDRsToRelease(dir)
	}
	plan, err := ParseConfig(req.Stdin, req.Args, source)
	if err != nil {
		return nil, err
	}
	if handsOut {
		addrs, err := nodeAddrs(plan.Families())
		if err != nil {
			return nil, err
		}
		if err := plan.CheckNodeAddrs(addrs, nodestate.Path(dir)); err != nil {
			return nil, err
		}
	}
	if err := utils.ValidateNetworkName(plan.Conf.Name); err != nil {
		return nil, err
	}
	disk, err := store.OpenDisk(plan.DataDir, plan.Conf.Name)
	if err != nil {
		return nil, storeError("", err)
	}
	return &session{plan: plan, disk: disk, alloc: &allocator.Allocator{Sets: plan.Sets, Exclude: plan.Exclude, Store: disk}}, nil
}

func (s *session) close() { _ = s.disk.Close() }

// errNoStore: the network has no store in its data directory.
var errNoStore = errors.New("no IPAM store")

// openForRelease opens the store for DEL and GC. When the PodCIDR is
// unknown (node.json missing, or never written) the session has no
// ranges: releasing goes by the owner index and the reservations, which
// need none, so that DEL never answers success while keeping an address.
// A store that does not exist is errNoStore (and is not created).
func openForRelease(req Request) (*session, error) {
	s, err := open(req, false)
	if !errors.Is(err, ErrPodCIDRUnknown) {
		return s, err
	}
	var c NetConf
	if json.Unmarshal(req.Stdin, &c) != nil || utils.ValidateNetworkName(c.Name) != nil {
		return nil, err
	}
	plan := &Plan{Conf: c, DataDir: c.IPAM.DataDir}
	if plan.DataDir == "" {
		plan.DataDir = DefaultDataDir
	}
	if !filepath.IsAbs(plan.DataDir) {
		return nil, err
	}
	if _, serr := os.Lstat(filepath.Join(plan.DataDir, c.Name, "lock")); errors.Is(serr, fs.ErrNotExist) {
		return nil, errNoStore
	}
	disk, oerr := store.OpenDisk(plan.DataDir, c.Name)
	if oerr != nil {
		return nil, storeError("", oerr)
	}
	return &session{plan: plan, disk: disk, alloc: &allocator.Allocator{Store: disk}}, nil
}

// openError turns an open failure into a CNI error. Config problems are
// code 7 already. A node state problem (PodCIDR unknown yet, a node.json
// that cannot be read or parsed, an unusable PodCIDR in it) gets
// nodeStateCode: 11 for ADD, DEL, CHECK and GC, since podnet-routed
// rewrites the file when the Node changes; 50 for STATUS, which maps
// every failure to 50 anyway (statusError). Any other failure that is not
// a CNI error yet gets nodeStateCode too.
func openError(err error, nodeStateCode uint) error {
	if errors.Is(err, ErrPodCIDRUnknown) {
		return types.NewError(nodeStateCode, fmt.Sprintf("podnet-ipam: %v", err), "podnet-routed writes the node's PodCIDR to node.json once the Node has spec.podCIDRs")
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	if errors.Is(err, nodestate.ErrBadPodCIDR) {
		return types.NewError(nodeStateCode, fmt.Sprintf("podnet-ipam: %v", err), "podnet-routed copies the Node's spec.podCIDRs into node.json: fix the Node's PodCIDR (the cluster's pod CIDR allocation)")
	}
	return types.NewError(nodeStateCode, fmt.Sprintf("podnet-ipam: %v", err), "")
}

// statusError maps a STATUS failure to code 50, "the plugin is not
// available (cannot service ADD requests)", keeping the cause's message and
// details. The CNI spec defines 50 and 51 for STATUS; 51 adds that existing
// containers may have lost connectivity, which no IPAM failure causes (not
// even a full range), so podnet-ipam never answers it.
func statusError(err error) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		return types.NewError(types.ErrPluginNotAvailable, te.Msg, te.Details)
	}
	return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("podnet-ipam: %v", err), "")
}

// stateDir is ipam.stateDir, else the plugin's top-level stateDir, else the
// default; a config that does not parse yields the default (ParseConfig
// reports the parse error).
func stateDir(stdin []byte) string {
	var c NetConf
	_ = json.Unmarshal(stdin, &c)
	if c.IPAM.StateDir != "" {
		return c.IPAM.StateDir
	}
	if c.StateDir != "" {
		return c.StateDir
	}
	return nodestate.DefaultDir
}

func owner(req Request) (allocator.Owner, error) {
	o := allocator.Owner{ContainerID: req.ContainerID, IfName: req.IfName}
	if err := store.ValidateOwner(o); err != nil {
		return o, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("podnet-ipam: %v", err), "")
	}
	return o, nil
}

// Add reserves one address per range set for the attachment (the same ones
// again when it already has them) and returns them as a CNI result.
//
// ADD runs at the nice value addNice (with CAP_SYS_NICE, which the
// runtime's plugins have; without it, at its own): its store lock
// serializes every ADD of the node, and when many pods start at once
// the holder would otherwise get its share of two CPUs among a hundred
// runnable plugins while the others wait for the lock (a lock convoy:
// the IPAM step's 90th percentile in 100 ADDs at once was 126-370 ms,
// 72-103 ms with it).
func Add(req Request) (res *current.Result, err error) {
	threadprio.Do(addNice, func() { res, err = add(req) })
	return res, err
}

// addNice is the nice value ADD holds the store's lock at (Add).
const addNice = -5

func add(req Request) (*current.Result, error) {
	o, err := owner(req)
	if err != nil {
		return nil, err
	}
	s, err := open(req, true)
	if err != nil {
		return nil, openError(err, types.ErrTryAgainLater)
	}
	defer s.close()
	s.disk.SetMeta(metaOf(req, time.Now()))
	prefixes, err := s.alloc.Allocate(o, s.plan.Requested)
	if err != nil {
		return nil, allocError(err)
	}
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: s.plan.Conf.IPAM.Routes}
	for _, p := range prefixes {
		ipc := &current.IPConfig{Address: net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if gw := s.alloc.GatewayOf(p.Addr()); gw.IsValid() {
			ipc.Gateway = gw.AsSlice()
		}
		result.IPs = append(result.IPs, ipc)
	}
	return result, nil
}

// Del releases what the attachment holds; nothing held is success. It
// needs no PodCIDR: without one (node.json missing) it releases by the
// owner index alone (openForRelease).
func Del(req Request) error {
	o, err := owner(req)
	if err != nil {
		return err
	}
	s, err := openForRelease(req)
	if errors.Is(err, errNoStore) {
		return nil // no store: nothing can have been allocated
	}
	if err != nil {
		return openError(err, types.ErrTryAgainLater)
	}
	defer s.close()
	if err := s.alloc.Release(o); err != nil {
		return storeError(fmt.Sprintf("release %s/%s: ", o.ContainerID, o.IfName), err)
	}
	return nil
}

// Check verifies that the attachment holds a reservation.
func Check(req Request) error {
	o, err := owner(req)
	if err != nil {
		return err
	}
	s, err := open(req, false)
	if err != nil {
		return openError(err, types.ErrTryAgainLater)
	}
	defer s.close()
	ips, err := s.disk.IPsOf(o)
	if err != nil {
		return storeError("", err)
	}
	if len(ips) == 0 {
		return types.NewError(types.ErrInternal, fmt.Sprintf("podnet-ipam: no reservation for container %s interface %s in network %s", o.ContainerID, o.IfName, s.plan.Conf.Name), "")
	}
	for _, ip := range ips {
		holder, ok, err := s.disk.OwnerOf(ip)
		if err != nil {
			return storeError("", err)
		}
		if !ok || holder != o {
			return types.NewError(types.ErrInternal, fmt.Sprintf("podnet-ipam: address %s of container %s is not reserved for it", ip, o.ContainerID), "")
		}
	}
	return nil
}

// GC releases every reservation of the network whose attachment is not in
// cni.dev/valid-attachments, and repairs the store after crashes.
func GC(req Request) error {
	s, err := openForRelease(req)
	if errors.Is(err, errNoStore) {
		return nil
	}
	if err != nil {
		return openError(err, types.ErrTryAgainLater)
	}
	defer s.close()
	valid := make([]allocator.Owner, 0, len(s.plan.Conf.ValidAttachments))
	for _, a := range s.plan.Conf.ValidAttachments {
		valid = append(valid, allocator.Owner{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	if err := s.disk.RemoveTemp(); err != nil {
		return storeError("GC: ", err)
	}
	// Each attachment the runtime no longer knows is released as DEL and
	// podnet-routed's leak reconcile release one (Allocator.Release);
	// Allocator.GC then repairs what crashes left (reservations without
	// an owner index entry, entries that point nowhere, the hints).
	owners, err := s.disk.Owners()
	if err != nil {
		return storeError("GC: ", err)
	}
	keep := make(map[allocator.Owner]bool, len(valid))
	for _, o := range valid {
		keep[o] = true
	}
	for o := range owners {
		if !keep[o] {
			if err := s.alloc.Release(o); err != nil {
				return storeError("GC: ", err)
			}
		}
	}
	if _, err := s.alloc.GC(valid); err != nil {
		return storeError("GC: ", err)
	}
	return nil
}

// Status reports code 50 when ADD cannot succeed, whatever the cause: a
// bad config, a PodCIDR unknown or unusable, a node.json or data directory
// that cannot be read, a range set with no free address. The message says
// which.
func Status(req Request) error {
	s, err := open(req, true)
	if err != nil {
		return statusError(openError(err, types.ErrPluginNotAvailable))
	}
	defer s.close()
	if err := s.alloc.Usable(); err != nil {
		return statusError(err)
	}
	return nil
}

// allocError maps allocator errors to CNI errors.
func allocError(err error) error {
	switch {
	case errors.Is(err, allocator.ErrExhausted):
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("podnet-ipam: %v", err), "every address of the range is reserved; GC or DEL of finished pods frees them")
	case errors.Is(err, allocator.ErrUnavailable):
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("podnet-ipam: %v", err), "")
	}
	return storeError("", err)
}

// storeError is the CNI error of a failed store operation: code 5 (I/O
// failure), saying what to do about it when that is known. prefix (e.g.
// "GC: ") goes before err in the message.
func storeError(prefix string, err error) *types.Error {
	details := ""
	switch {
	case errors.Is(err, store.ErrUnsafeEntry):
		details = "podnet-ipam does not follow symlinks or use special files in its data directory (ipam.dataDir) and never creates any there; remove the entry named above"
	case errors.Is(err, syscall.ENOSPC):
		details = "the file system of the IPAM data directory (ipam.dataDir) is full: free space on it and retry (a failed ADD leaves nothing reserved)"
	}
	return types.NewError(types.ErrIOFailure, fmt.Sprintf("podnet-ipam: %s%v", prefix, err), details)
}
