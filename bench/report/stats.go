package main

import (
	"fmt"
	"math"
	"slices"
)

// pct is the nearest-rank percentile p (0 < p <= 100) of xs, NaN when
// there is no sample.
func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(xs []float64) float64 { return pct(xs, 50) }

func maxOf(xs []float64) float64 { return pct(xs, 100) }

// rollingMedian is the median of the window of w samples centred on each
// index (shorter at the ends).
func rollingMedian(xs []float64, w int) []float64 {
	out := make([]float64, len(xs))
	for i := range xs {
		lo, hi := max(0, i-w/2), min(len(xs), i+w/2+1)
		out[i] = median(xs[lo:hi])
	}
	return out
}

// dist is the latency distribution of one verb of one stack in one mode,
// pooled over the repetitions, with the per-repetition medians.
type dist struct {
	All    []float64
	RepP50 []float64
	CPU    []float64 // CPU ms per verb, per repetition
	Wall   float64   // summed phase wall time (s)
	N      int
}

func (d dist) p(q float64) float64 { return pct(d.All, q) }

// cpu is the CPU per verb over all repetitions (median of the per-rep
// values).
func (d dist) cpu() float64 { return median(d.CPU) }

type cell struct{ add, del dist }

// aggregate groups the runs by stack and mode.
func aggregate(runs []cniRun) map[[2]string]*cell {
	out := map[[2]string]*cell{}
	for _, r := range runs {
		k := [2]string{r.Stack, r.Mode}
		c := out[k]
		if c == nil {
			c = &cell{}
			out[k] = c
		}
		c.add.All = append(c.add.All, r.AddMs...)
		c.add.RepP50 = append(c.add.RepP50, median(r.AddMs))
		c.add.CPU = append(c.add.CPU, r.addCPU())
		c.add.Wall += r.AddWallS
		c.add.N += len(r.AddMs)
		c.del.All = append(c.del.All, r.DelMs...)
		c.del.RepP50 = append(c.del.RepP50, median(r.DelMs))
		c.del.CPU = append(c.del.CPU, r.delCPU())
		c.del.Wall += r.DelWallS
		c.del.N += len(r.DelMs)
	}
	return out
}

// ratio is a/b per repetition (the runs of one repetition ran back to
// back, so their ratio cancels most of the machine's drift): the median and
// the range over the repetitions.
type ratio struct{ Med, Lo, Hi float64 }

func repRatio(a, b []float64) ratio {
	var rs []float64
	for i := 0; i < len(a) && i < len(b); i++ {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	if len(rs) == 0 {
		return ratio{math.NaN(), math.NaN(), math.NaN()}
	}
	return ratio{median(rs), pct(rs, 0.0001), maxOf(rs)}
}

func (r ratio) String() string {
	if math.IsNaN(r.Med) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f)", r.Med, r.Lo, r.Hi)
}

// fmtMs renders milliseconds with a precision that suits the magnitude.
func fmtMs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
