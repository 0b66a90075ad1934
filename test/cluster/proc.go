package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a process the cluster started (podnet-routed).
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProc starts bin in netns with stdout and stderr appended to log.
func startProc(netns *NetNS, dieWithUs bool, log, bin string, args ...string) (*proc, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := netns.StartProcess(cmd, dieWithUs); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s in %s: %w", filepath.Base(bin), netns.Name, err)
	}
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to limit, then kills. An exit caused by
// the SIGTERM is not an error.
func (p *proc) stop(limit time.Duration) error {
	if p == nil {
		return nil
	}
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(limit):
			_ = p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("%s ignored SIGTERM for %s: killed", filepath.Base(p.cmd.Path), limit)
		}
	}
	return p.exitError()
}

// exitError is the process's exit error, nil for a clean exit (or one by
// SIGTERM).
func (p *proc) exitError() error {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
		return fmt.Errorf("%s: %v", filepath.Base(p.cmd.Path), p.err)
	}
	return p.err
}

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
