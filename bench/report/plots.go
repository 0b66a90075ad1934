package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// One colour per stack, the same in every plot; podnet's stacks solid,
// the reference plugins dashed.
var stackColor = map[string]color.Color{
	podnetStack:    color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	reconcileStack: color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	bridgeStack:    color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	ptpStack:       color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	refBrStack:     color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

func styleLine(l *plotter.Line, stack string) {
	l.Color = stackColor[stack]
	l.Width = vg.Points(1.6)
	if stack == ptpStack || stack == refBrStack {
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	}
}

// savePNG draws plots on a rows×cols grid into dir/name.
func savePNG(dir, name string, grid [][]*plot.Plot, w, h vg.Length) (string, error) {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(grid), Cols: len(grid[0]), PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 6,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j := range grid[i] {
			if grid[i][j] != nil {
				grid[i][j].Draw(canvases[i][j])
			}
		}
	}
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return "", err
	}
	return path, f.Close()
}

// ecdf returns the empirical CDF of xs as a line.
func ecdf(xs []float64) plotter.XYs {
	s := slices.Clone(xs)
	slices.Sort(s)
	pts := make(plotter.XYs, len(s))
	for i, v := range s {
		pts[i] = plotter.XY{X: v, Y: float64(i+1) / float64(len(s))}
	}
	return pts
}

// plotCNI draws the ADD/DEL latency CDFs of every stack, sequential and
// concurrent, on a log time axis.
func plotCNI(dir string, cells map[[2]string]*cell, workers int) (string, error) {
	grid := make([][]*plot.Plot, 2)
	for i, verb := range []string{"ADD", "DEL"} {
		for _, mode := range []string{seqMode, concMode} {
			p := plot.New()
			label := "sequential"
			if mode == concMode {
				label = fmt.Sprintf("%d concurrent", workers)
			}
			p.Title.Text = fmt.Sprintf("%s latency, %s", verb, label)
			p.X.Label.Text = "ms (log scale)"
			p.Y.Label.Text = "fraction of verbs ≤ x"
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = ticks125{}
			p.Y.Min, p.Y.Max = 0, 1
			p.Add(plotter.NewGrid())
			// The legend goes bottom right, into room made by stretching
			// the axis past the slowest verb.
			p.Legend.Top, p.Legend.Left = false, false
			lo, hi := math.Inf(1), 0.0
			for _, s := range stackOrder {
				c := cells[[2]string{s, mode}]
				if c == nil {
					continue
				}
				d := c.add
				if verb == "DEL" {
					d = c.del
				}
				l, err := plotter.NewLine(ecdf(d.All))
				if err != nil {
					return "", err
				}
				styleLine(l, s)
				p.Add(l)
				p.Legend.Add(s, l)
				lo, hi = math.Min(lo, pct(d.All, 0.0001)), math.Max(hi, maxOf(d.All))
			}
			if hi > 0 {
				p.X.Min, p.X.Max = lo/1.2, hi*8
			}
			grid[i] = append(grid[i], p)
		}
	}
	return savePNG(dir, "cni-latency.png", grid, vg.Points(1000), vg.Points(760))
}

// plotOccupancy draws ADD latency against the pods already on the node:
// every ADD as a faint dot, a rolling median of 50 as a line.
func plotOccupancy(dir string, occ []occRun) (string, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("ADD latency vs pods on the node (%d pods per node, stacks taking turns)", occ[0].Pods)
	p.X.Label.Text = "pods on the node before this ADD"
	p.Y.Label.Text = "ADD latency, ms"
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	var all []float64
	for _, o := range occ {
		all = append(all, o.AddMs...)
	}
	p.Y.Min, p.Y.Max = 0, pct(all, 99)*1.25 // room for the legend
	for _, o := range occ {
		dots := make(plotter.XYs, len(o.AddMs))
		for i, v := range o.AddMs {
			dots[i] = plotter.XY{X: float64(i), Y: min(v, p.Y.Max)}
		}
		sc, err := plotter.NewScatter(dots)
		if err != nil {
			return "", err
		}
		c := stackColor[o.Stack].(color.RGBA)
		sc.GlyphStyle.Color = color.NRGBA{R: c.R, G: c.G, B: c.B, A: 0x50} // faint: one dot per ADD
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		sc.GlyphStyle.Radius = vg.Points(1.3)
		p.Add(sc)
		roll := rollingMedian(o.AddMs, 50)
		line := make(plotter.XYs, len(roll))
		for i, v := range roll {
			line[i] = plotter.XY{X: float64(i), Y: v}
		}
		l, err := plotter.NewLine(line)
		if err != nil {
			return "", err
		}
		styleLine(l, o.Stack)
		l.Width = vg.Points(2.2)
		p.Add(l)
		p.Legend.Add(o.Stack+" (rolling median of 50)", l)
		if len(o.ControlAddMs) == 0 {
			continue
		}
		// the control node's ADDs, by chunk: what the machine gave an ADD
		// on an empty node meanwhile
		ctl := make(plotter.XYs, 0, len(o.ControlAddMs))
		for c, ms := range o.ControlAddMs {
			if len(ms) > 0 {
				ctl = append(ctl, plotter.XY{X: (float64(c) + 0.5) * float64(o.Chunk), Y: median(ms)})
			}
		}
		cl, err := plotter.NewLine(ctl)
		if err != nil {
			return "", err
		}
		styleLine(cl, o.Stack)
		cl.Width = vg.Points(1.2)
		cl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(cl)
		p.Legend.Add(o.Stack+", control node (median of each chunk)", cl)
	}
	return savePNG(dir, "add-vs-occupancy.png", [][]*plot.Plot{{p}}, vg.Points(900), vg.Points(480))
}

// plotRouted draws, against the number of Nodes and for each mode: sync →
// routes, the Node change p99 (whole and the daemon's share), the RSS
// and the CPU seconds, each with its target.
func plotRouted(dir string, all []routedScale) (string, error) {
	modes := map[string][]routedScale{}
	var order []string
	for _, s := range all {
		if _, ok := modes[s.mode()]; !ok {
			order = append(order, s.mode())
		}
		modes[s.mode()] = append(modes[s.mode()], s)
	}
	var nodes []routedScale
	seen := map[int]bool{}
	for _, s := range all {
		if !seen[s.Nodes] {
			seen[s.Nodes] = true
			nodes = append(nodes, s)
		}
	}
	mk := func(title, ylabel string) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "Nodes (log scale)"
		p.Y.Label.Text = ylabel
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.ConstantTicks(nodeTicks(nodes))
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
		return p
	}
	colors := []color.Color{stackColor[podnetStack], stackColor[ptpStack], stackColor[bridgeStack], stackColor[refBrStack]}
	line := func(p *plot.Plot, name string, c color.Color, dashed bool, scales []routedScale, f func(routedScale) float64) error {
		pts := make(plotter.XYs, len(scales))
		for i, s := range scales {
			pts[i] = plotter.XY{X: float64(s.Nodes), Y: f(s)}
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color, sc.Color = c, c
		l.Width = vg.Points(1.8)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l, sc)
		p.Legend.Add(name, l)
		return nil
	}
	limit := func(p *plot.Plot, name string, v float64) {
		xs := plotter.XYs{{X: float64(nodes[0].Nodes), Y: v}, {X: float64(nodes[len(nodes)-1].Nodes), Y: v}}
		l, _ := plotter.NewLine(xs)
		l.Color = color.Gray{Y: 0x70}
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(l)
		p.Legend.Add(name, l)
	}
	conv := mk("informer sync → all routes in the kernel", "seconds")
	upd := mk("Node change → kernel p99, under churn", "ms")
	mem := mk("podnet-routed RSS", "MiB")
	cpu := mk("podnet-routed CPU to sync", "CPU seconds")
	for i, m := range order {
		c, sc := colors[i%len(colors)], modes[m]
		if err := line(conv, m, c, false, sc, func(s routedScale) float64 { return s.SyncToRoutesS }); err != nil {
			return "", err
		}
		if err := line(upd, m, c, false, sc, func(s routedScale) float64 { return pct(s.UpdateMs, 99) }); err != nil {
			return "", err
		}
		if err := line(upd, m+": daemon's share", c, true, sc, func(s routedScale) float64 { return pct(s.UpdateDaemonMs, 99) }); err != nil {
			return "", err
		}
		if err := line(mem, m, c, false, sc, func(s routedScale) float64 { return float64(s.RSSKiB) / 1024 }); err != nil {
			return "", err
		}
		if err := line(mem, m+": peak", c, true, sc, func(s routedScale) float64 { return float64(s.HWMKiB) / 1024 }); err != nil {
			return "", err
		}
		if err := line(cpu, m, c, false, sc, func(s routedScale) float64 { return s.CPUSyncS }); err != nil {
			return "", err
		}
	}
	limit(conv, "targets: 1 s at 5,000, 2 s at 10,000", 1)
	limit(upd, "target p99 at 5,000: 10 ms", 10)
	limit(mem, "target at 5,000: 40 MiB", 40)
	for _, p := range []*plot.Plot{conv, upd, mem, cpu} {
		p.Y.Min = 0
	}
	return savePNG(dir, "routed.png", [][]*plot.Plot{{conv, upd}, {mem, cpu}}, vg.Points(1100), vg.Points(800))
}

// ticks125 marks a log axis at 1, 2 and 5 times every power of ten, with
// unlabelled minor ticks at the other integers.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		dec := math.Pow(10, e)
		for m := 1.0; m <= 9; m++ {
			v := m * dec
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ts = append(ts, t)
		}
	}
	return ts
}

func nodeTicks(scales []routedScale) []plot.Tick {
	var ts []plot.Tick
	for _, s := range scales {
		ts = append(ts, plot.Tick{Value: float64(s.Nodes), Label: fmt.Sprint(s.Nodes)})
	}
	return ts
}
