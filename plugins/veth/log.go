package veth

import (
	"fmt"
	"log/slog"
	"os"

	"golang.org/x/sys/unix"
)

// newLogger returns a logger writing to conf.LogFile, or one that discards
// (whose records are never formatted: slog.DiscardHandler is disabled at
// every level).
// The returned closer must be called when the plugin is done.
func newLogger(conf *netConf, plugin string) (*slog.Logger, func()) {
	if conf.LogFile == "" {
		return slog.New(slog.DiscardHandler), func() {}
	}
	// O_NOFOLLOW, O_NONBLOCK (a FIFO must not hang ADD) and a regular-file
	// check: a symlink, FIFO or device planted at the log path must not make
	// a root process append to another file.
	f, err := os.OpenFile(conf.LogFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if err == nil {
		if st, serr := f.Stat(); serr != nil || !st.Mode().IsRegular() {
			_ = f.Close()
			err = fmt.Errorf("not a regular file")
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: not logging to logFile %s: %v\n", plugin, conf.LogFile, err)
		return slog.New(slog.DiscardHandler), func() {}
	}
	l := slog.New(slog.NewJSONHandler(f, nil)).With("plugin", plugin, "network", conf.Name)
	return l, func() { _ = f.Close() }
}
