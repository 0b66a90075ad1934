package veth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLoggerRefusesSymlinkAndFIFO: a symlink planted at logFile must not
// make the plugin (root) append to the file it points to, and a FIFO must
// not block it; a regular file is logged to.
func TestLoggerRefusesSymlinkAndFIFO(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.WriteFile(outside, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "podnet.log")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.log")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, fifo} {
		log, done := newLogger(&netConf{LogFile: p}, "podnet")
		log.Info("hello")
		done()
	}
	if b, _ := os.ReadFile(outside); string(b) != "precious\n" {
		t.Errorf("the symlink's target was written: %q", b)
	}
	regular := filepath.Join(dir, "regular.log")
	log, done := newLogger(&netConf{LogFile: regular}, "podnet")
	log.Info("hello")
	done()
	if b, _ := os.ReadFile(regular); !strings.Contains(string(b), `"msg":"hello"`) {
		t.Errorf("regular log file: %q", b)
	}
}
