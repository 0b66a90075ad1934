package veth

import (
	"encoding/json"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// traceEnv names the opt-in step trace: with PODNET_TRACE=<file> in the
// plugin's environment, every ADD and DEL appends one JSON line to file
// with the wall and CPU time of each step, in microseconds. CPU is this
// process's plus that of the children it reaped (an exec'd IPAM plugin).
// Process start (exec, Go runtime) is not in it: it is what a runtime's
// measured time has on top of the trace's total.
const traceEnv = "PODNET_TRACE"

// trace times the steps of one verb; a nil trace does nothing.
type trace struct {
	path    string
	Verb    string      `json:"verb"`
	Steps   []traceStep `json:"steps"`
	WallUS  int64       `json:"wallUs"`
	CPUUS   int64       `json:"cpuUs"`
	Error   string      `json:"error,omitempty"`
	start   time.Time
	last    time.Time
	lastCPU time.Duration
	cpu0    time.Duration
}

type traceStep struct {
	Step   string `json:"step"`
	WallUS int64  `json:"wallUs"`
	CPUUS  int64  `json:"cpuUs"`
}

func newTrace(verb string) *trace {
	path := os.Getenv(traceEnv)
	if path == "" {
		return nil
	}
	now, cpu := time.Now(), cpuTime()
	return &trace{path: path, Verb: verb, start: now, last: now, lastCPU: cpu, cpu0: cpu}
}

// mark ends the step called name (it began where the previous one ended).
func (t *trace) mark(name string) {
	if t == nil {
		return
	}
	now, cpu := time.Now(), cpuTime()
	t.Steps = append(t.Steps, traceStep{Step: name, WallUS: now.Sub(t.last).Microseconds(), CPUUS: (cpu - t.lastCPU).Microseconds()})
	t.last, t.lastCPU = now, cpu
}

// write appends the trace line (best effort: tracing never fails a verb).
func (t *trace) write(err *error) {
	if t == nil {
		return
	}
	t.WallUS = time.Since(t.start).Microseconds()
	t.CPUUS = (cpuTime() - t.cpu0).Microseconds()
	if *err != nil {
		t.Error = (*err).Error()
	}
	line, jerr := json.Marshal(t)
	if jerr != nil {
		return
	}
	f, oerr := os.OpenFile(t.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if oerr != nil {
		return
	}
	_, _ = f.Write(append(line, '\n'))
	_ = f.Close()
}

func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if unix.Getrusage(who, &ru) == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}
