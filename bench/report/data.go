package main

// The JSON the benchmark drivers write (test/bench/cnibench,
// test/bench/routedbench) and scripts/bench.sh's meta.json. Only the fields
// the report uses are declared.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

type cniData struct {
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	DataFS  string    `json:"data_fs"`
	Stacks  []struct {
		Name   string `json:"name"`
		Plugin string `json:"plugin"`
		IPAM   string `json:"ipam"`
		Conf   string `json:"conflist"`
		// Reconcile describes the leak reconcile running during the
		// stack's phases ("" none)
		Reconcile string `json:"reconcile"`
	} `json:"stacks"`
	Runs      []cniRun   `json:"runs"`
	Occupancy []occRun   `json:"occupancy"`
	Floors    []floorRun `json:"floors"`
}

type cniRun struct {
	Stack     string                `json:"stack"`
	Mode      string                `json:"mode"`
	Workers   int                   `json:"workers"`
	Rep       int                   `json:"rep"`
	Pods      int                   `json:"pods"`
	AddMs     []float64             `json:"add_ms"`
	DelMs     []float64             `json:"del_ms"`
	AddWallS  float64               `json:"add_wall_s"`
	DelWallS  float64               `json:"del_wall_s"`
	AddUserMs float64               `json:"add_user_ms"`
	AddSysMs  float64               `json:"add_sys_ms"`
	DelUserMs float64               `json:"del_user_ms"`
	DelSysMs  float64               `json:"del_sys_ms"`
	Errors    []string              `json:"errors"`
	Leak      string                `json:"leak"`
	Steps     map[string]*verbTrace `json:"steps"`
	NetnsDelS float64               `json:"netns_del_s"`
	SettleS   float64               `json:"settle_s"`
	// the leak reconcile during the phases (reconcileStack)
	ReconcilePasses        int       `json:"reconcile_passes"`
	ReconcilePassMs        []float64 `json:"reconcile_pass_ms"`
	ReconcileHolds         int       `json:"reconcile_lock_holds"`
	ReconcileMaxLockHoldMs float64   `json:"reconcile_max_lock_hold_ms"`
	ReconcilePlanted       int       `json:"reconcile_planted"`
	ReconcileReclaimed     int       `json:"reconcile_reclaimed"`
}

func (r cniRun) addCPU() float64 { return (r.AddUserMs + r.AddSysMs) / float64(r.Pods) }
func (r cniRun) delCPU() float64 { return (r.DelUserMs + r.DelSysMs) / float64(r.Pods) }

type occRun struct {
	Stack     string    `json:"stack"`
	Pods      int       `json:"pods"`
	Chunk     int       `json:"chunk"`
	AddMs     []float64 `json:"add_ms"`
	DelMs     []float64 `json:"del_ms"`
	AddUserMs float64   `json:"add_user_ms"`
	AddSysMs  float64   `json:"add_sys_ms"`
	DelUserMs float64   `json:"del_user_ms"`
	DelSysMs  float64   `json:"del_sys_ms"`
	Errors    []string  `json:"errors"`
	Leak      string    `json:"leak"`
	// ControlAddMs: the stack's control node's ADDs after each chunk of
	// ADDs (by chunk); InsideMs: podnet's own time of each ADD (its step
	// trace), by pod index. Both absent from older results.
	ControlAddMs [][]float64 `json:"control_add_ms"`
	InsideMs     []float64   `json:"inside_ms"`
}

// controlOf pools the control node's ADDs of the chunks that pods
// lo..hi-1 were added in.
func (o occRun) controlOf(lo, hi int) []float64 {
	var out []float64
	for c := range o.ControlAddMs {
		if c*o.Chunk < hi && (c+1)*o.Chunk > lo {
			out = append(out, o.ControlAddMs[c]...)
		}
	}
	return out
}

// flatness is the ADD p50 of the last k pods over that of the first k
// (raw), and the same with each divided by the control node's ADD p50 of
// their chunks (corr; 0 without a control node).
func (o occRun) flatness(k int) (raw, corr float64) {
	n := len(o.AddMs)
	first, last := median(o.AddMs[:k]), median(o.AddMs[n-k:])
	raw = last / first
	if c0, c1 := o.controlOf(0, k), o.controlOf(n-k, n); len(c0) > 0 && len(c1) > 0 {
		corr = (last / median(c1)) / (first / median(c0))
	}
	return raw, corr
}

// reconcileData is test/bench/reconcilebench's reconcile.json: one leak
// reconcile pass over Reservations reservations, alive and dead.
type reconcileData struct {
	Reservations int             `json:"reservations"`
	Reps         int             `json:"reps"`
	SettleS      float64         `json:"settle_s"`
	LockBudgetMs float64         `json:"lock_budget_ms"`
	GraceS       float64         `json:"grace_s"`
	DataFS       string          `json:"data_fs"`
	Note         string          `json:"note"`
	FillMs       []float64       `json:"fill_ms"`
	Live         []reconcilePass `json:"live"`
	Dead         []reconcilePass `json:"dead"`
	Seconds      float64         `json:"seconds"`
}

type reconcilePass struct {
	Rep                int     `json:"rep"`
	PassMs             float64 `json:"pass_ms"`
	MaxLockHoldMs      float64 `json:"max_lock_hold_ms"`
	Holds              int     `json:"holds"`
	HoldSumMs          float64 `json:"hold_sum_ms"`
	Reclaimed          int     `json:"reclaimed"`
	RecordsAfter       int     `json:"records_after"`
	ReservedAfter      int     `json:"reserved_after"`
	ContenderTakes     int     `json:"contender_takes"`
	ContenderMaxWaitMs float64 `json:"contender_max_wait_ms"`
	ContenderP50WaitMs float64 `json:"contender_p50_wait_ms"`
	Err                string  `json:"error"`
}

type floorRun struct {
	Name  string    `json:"name"`
	Ms    []float64 `json:"ms"`
	CPUMs []float64 `json:"cpu_ms"`
	Note  string    `json:"note"`
}

type routedData struct {
	Seconds float64       `json:"seconds"`
	Samples int           `json:"samples"`
	Flags   string        `json:"flags"`
	Scales  []routedScale `json:"scales"`
}

type routedScale struct {
	Nodes           int       `json:"nodes"`
	Routes          int       `json:"routes"`
	CreateS         float64   `json:"create_s"`
	CreatedNodes    int       `json:"created_nodes"`
	StartToSyncS    float64   `json:"start_to_sync_s"`
	SyncToRoutesS   float64   `json:"sync_to_routes_s"`
	SyncToAppliedS  float64   `json:"sync_to_applied_s"`
	StartToRoutesS  float64   `json:"start_to_routes_s"`
	Polled          bool      `json:"polled"`
	MetricRoutes    float64   `json:"metric_programmed"`
	UpdateMs        []float64 `json:"update_ms"`
	UpdateAPIMs     []float64 `json:"update_api_ms"`
	UpdateTimeouts  int       `json:"update_timeouts"`
	RSSKiB          int       `json:"rss_kib"`
	HWMKiB          int       `json:"hwm_kib"`
	RSSAfterSyncKiB int       `json:"rss_after_sync_kib"`
	RSSChurnKiB     int       `json:"rss_churn_kib"` // before the no-op full apply (0: not measured)
	// issue 14
	Mode           string         `json:"mode"`
	UpdateDaemonMs []float64      `json:"update_daemon_ms"`
	RSSAnonKiB     int            `json:"rss_anon_kib"`
	RSSFileKiB     int            `json:"rss_file_kib"`
	FDBs           int            `json:"fdbs"`
	CPUSyncS       float64        `json:"cpu_sync_s"`
	CPUS           float64        `json:"cpu_s"`
	ChurnPerS      float64        `json:"churn_per_s"`
	Churned        int            `json:"churned"`
	NoopApplies    int            `json:"noop_applies"`
	NoopRouteMsgs  int            `json:"noop_route_msgs"`
	NoopFDBMsgs    int            `json:"noop_fdb_msgs"`
	APIRequests    map[string]int `json:"api_requests"`
	APIWatchesOpen int            `json:"api_watches_open"`
}

// mode is the scale's encapsulation; results from before issue 14 were
// all `none`.
func (s routedScale) mode() string {
	if s.Mode == "" {
		return "none"
	}
	return s.Mode
}

type datapathData struct {
	Seconds  float64 `json:"seconds"`
	Duration int     `json:"duration_s"`
	Omit     int     `json:"omit_s"`
	Iperf    string  `json:"iperf3"`
	Modes    []struct {
		Encap    string `json:"encap"`
		Underlay string `json:"underlay"` // "" (results from before dual-stack) = ipv4
		PodMTU   int    `json:"pod_mtu"`
		Runs     []struct {
			Path        string  `json:"path"`
			Family      string  `json:"family"` // "" = ipv4
			Rep         int     `json:"rep"`
			Gbps        float64 `json:"gbps"`
			Retransmits int     `json:"retransmits"`
			MSS         int     `json:"mss"`
			Load1       float64 `json:"load1"` // 0: not recorded
		} `json:"runs"`
		PingFits  string            `json:"ping_fits"`
		PingOver  string            `json:"ping_over"`
		PingFits6 string            `json:"ping_fits6"`
		PingOver6 string            `json:"ping_over6"`
		FragDelta map[string]string `json:"frag_delta"`
		Unrouted  map[string]string `json:"unrouted"`
		Failed    string            `json:"failed"`
	} `json:"modes"`
}

// metaData is written by scripts/bench.sh.
type metaData struct {
	Date        string  `json:"date"`
	Command     string  `json:"command"`
	Commit      string  `json:"commit"`
	CPU         string  `json:"cpu"`
	Nproc       int     `json:"nproc"`
	MemGiB      float64 `json:"mem_gib"`
	Kernel      string  `json:"kernel"`
	Go          string  `json:"go"`
	CNIPlugins  string  `json:"cni_plugins"`
	CNITools    string  `json:"cni_tools_dir"`
	KubeAPI     string  `json:"kube_apiserver"`
	Etcd        string  `json:"etcd"`
	Iperf       string  `json:"iperf3"`
	LoadBefore  string  `json:"load_before"`
	LoadAfter   string  `json:"load_after"`
	StartedUnix int64   `json:"started_unix"`
	EndedUnix   int64   `json:"ended_unix"` // 0: an older meta.json
	Stages      []stage `json:"stages"`
}

type stage struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	Status  string  `json:"status"` // "ok" or the failure
}

// load reads in/<name> into v; a missing file leaves v nil-ish and is
// reported by the caller as a skipped section.
func load(dir, name string, v any) error {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
