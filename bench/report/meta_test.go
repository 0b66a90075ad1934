package main

import "testing"

// TestWallTime: the report says how long the run took, the same however
// long after the run it is written; an older meta.json without its end
// gets the stages' sum.
func TestWallTime(t *testing.T) {
	for _, tc := range []struct {
		m    metaData
		want string
	}{
		{metaData{StartedUnix: 1000, EndedUnix: 1000 + 3723}, "1h2m3s"},
		{metaData{StartedUnix: 1000, Stages: []stage{{Seconds: 60}, {Seconds: 30.5}}}, "1m30s (the stages' sum)"},
		{metaData{StartedUnix: 2000, EndedUnix: 1000, Stages: []stage{{Seconds: 5}}}, "5s (the stages' sum)"},
		{metaData{}, "—"},
	} {
		if got := tc.m.wallTime(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.m, got, tc.want)
		}
	}
}
