package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestReadTrace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "trace.jsonl")
	lines := `{"verb":"ADD","steps":[{"step":"config","wallUs":100,"cpuUs":50},{"step":"veth","wallUs":2000,"cpuUs":900}],"wallUs":2200,"cpuUs":1000}
{"verb":"ADD","steps":[{"step":"config","wallUs":300,"cpuUs":70},{"step":"veth","wallUs":4000,"cpuUs":1100}],"wallUs":4400,"cpuUs":1200}
{"verb":"DEL","steps":[{"step":"veth-delete","wallUs":22000,"cpuUs":1000}],"wallUs":22500,"cpuUs":1300}
`
	if err := os.WriteFile(p, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readTrace(p)
	if err != nil {
		t.Fatal(err)
	}
	add, del := got["ADD"], got["DEL"]
	if add == nil || del == nil || add.N != 2 || del.N != 1 {
		t.Fatalf("verbs: %+v", got)
	}
	if len(add.Steps) != 2 || add.Steps[0].Step != "config" || add.Steps[1].Step != "veth" {
		t.Fatalf("ADD steps out of order: %+v", add.Steps)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	// median() takes the upper middle of an even count
	if v := add.Steps[1]; !near(v.WallMeanMs, 3) || !near(v.CPUMeanMs, 1) || !near(v.WallP50Ms, 4) {
		t.Errorf("veth: %+v, want mean wall 3 ms, CPU 1 ms, p50 4 ms", v)
	}
	if !near(add.Total.WallMeanMs, 3.3) || !near(del.Total.CPUMeanMs, 1.3) {
		t.Errorf("totals: ADD %+v DEL %+v", add.Total, del.Total)
	}
	if err := os.WriteFile(p, []byte("not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readTrace(p); err == nil {
		t.Error("a corrupt trace: no error")
	}
}
