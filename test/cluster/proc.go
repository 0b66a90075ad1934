package cluster

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pidRef names a process in a way that survives PID reuse: its PID, its
// start time (clock ticks since boot) and command name.
type pidRef struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"`
	Comm  string `json:"comm"`
}

func newPidRef(pid int) pidRef {
	start, comm, _ := procStat(pid)
	return pidRef{Pid: pid, Start: start, Comm: comm}
}

// procStat reads a process's start time and command name.
func procStat(pid int) (uint64, string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", err
	}
	// pid (comm) state ppid ... field 22 is starttime; comm may hold spaces.
	open, close := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || close < open {
		return 0, "", fmt.Errorf("bad /proc/%d/stat", pid)
	}
	comm := string(data[open+1 : close])
	fields := strings.Fields(string(data[close+1:]))
	if len(fields) < 20 {
		return 0, "", fmt.Errorf("bad /proc/%d/stat", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, "", fmt.Errorf("process %d has exited", pid)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	return start, comm, err
}

// same says whether the process is still the one recorded.
func (r pidRef) same() bool {
	start, comm, err := procStat(r.Pid)
	return err == nil && start == r.Start && comm == r.Comm
}

// kill terminates the recorded process if it still runs: SIGTERM, then
// SIGKILL after limit. It reports whether it was running.
func (r pidRef) kill(limit time.Duration) bool {
	if !r.same() {
		return false
	}
	_ = syscall.Kill(r.Pid, syscall.SIGTERM)
	deadline := time.Now().Add(limit)
	for r.same() {
		if time.Now().After(deadline) {
			_ = syscall.Kill(r.Pid, syscall.SIGKILL)
			deadline = time.Now().Add(time.Hour)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
