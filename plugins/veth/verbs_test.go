package veth

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

func TestRollback(t *testing.T) {
	t.Run("newest first, once", func(t *testing.T) {
		var ran []int
		r := &undoStack{}
		for i := 1; i <= 3; i++ {
			r.push(func() error { ran = append(ran, i); return nil })
		}
		r.run()
		if want := []int{3, 2, 1}; !slices.Equal(ran, want) {
			t.Fatalf("undos ran as %v, want %v", ran, want)
		}
		r.run()
		if want := []int{3, 2, 1}; !slices.Equal(ran, want) {
			t.Errorf("second Run re-ran undos: %v", ran)
		}
	})

	t.Run("a failing undo does not stop the others and is logged", func(t *testing.T) {
		var buf bytes.Buffer
		var ran []string
		r := &undoStack{log: slog.New(slog.NewTextHandler(&buf, nil))}
		r.push(func() error { ran = append(ran, "ipam"); return nil })
		r.push(func() error { ran = append(ran, "veth"); return errors.New("veth busy") })
		r.push(func() error { ran = append(ran, "route"); return nil })
		r.run()
		if want := []string{"route", "veth", "ipam"}; !slices.Equal(ran, want) {
			t.Errorf("undos ran as %v, want %v", ran, want)
		}
		if !strings.Contains(buf.String(), "veth busy") {
			t.Errorf("undo failure not logged; log: %q", buf.String())
		}
	})

	t.Run("failing undo without a logger", func(t *testing.T) {
		ran := 0
		r := &undoStack{}
		r.push(func() error { ran++; return errors.New("boom") })
		r.push(func() error { ran++; return errors.New("boom") })
		r.run()
		if ran != 2 {
			t.Errorf("%d undos ran, want 2", ran)
		}
	})

	t.Run("push after run", func(t *testing.T) {
		var ran []string
		r := &undoStack{}
		r.push(func() error { ran = append(ran, "old"); return nil })
		r.run()
		r.push(func() error { ran = append(ran, "new"); return nil })
		r.run()
		if want := []string{"old", "new"}; !slices.Equal(ran, want) {
			t.Errorf("undos ran as %v, want %v", ran, want)
		}
	})

	t.Run("empty", func(t *testing.T) {
		(&undoStack{}).run()
	})
}
