// Package threadprio gives one goroutine's OS thread, and only it, a CPU
// priority (a nice value) of its own: Linux keeps a nice value per thread.
package threadprio

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

func check(nice int) error {
	if nice < -20 || nice > 19 {
		return fmt.Errorf("nice %d out of -20..19", nice)
	}
	return nil
}

// Check tells whether the calling goroutine's thread may take the nice
// value nice (0 always): it tries it and gives the thread its own back.
// A refusal (no CAP_SYS_NICE to go below the process's) is returned.
func Check(nice int) error {
	if nice == 0 {
		return nil
	}
	if err := check(nice); err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, tid) // 20 - nice
	if err != nil {
		return fmt.Errorf("getpriority(thread %d): %w", tid, err)
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
		return fmt.Errorf("setpriority(thread %d, %d): %w", tid, nice, err)
	}
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, 20-raw); err != nil {
		runtime.LockOSThread() // (as Do: the thread ends with the goroutine)
		return fmt.Errorf("setpriority(thread %d, %d): %w", tid, 20-raw, err)
	}
	return nil
}

// Do runs f on the calling goroutine's thread with the nice value nice,
// then gives the thread its nice value back before another goroutine can
// run on it. nice 0, or a refusal to change it, runs f as it is.
func Do(nice int, f func()) {
	if nice == 0 || check(nice) != nil {
		f()
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, tid) // 20 - nice
	if err != nil || unix.Setpriority(unix.PRIO_PROCESS, tid, nice) != nil {
		f()
		return
	}
	defer func() {
		if unix.Setpriority(unix.PRIO_PROCESS, tid, 20-raw) != nil {
			// a thread that cannot be given its priority back is not
			// handed to other goroutines: it ends with this one
			runtime.LockOSThread()
		}
	}()
	f()
}

// Nice is the nice value of the calling goroutine's current thread.
func Nice() (int, error) {
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		return 0, err
	}
	return 20 - raw, nil
}
