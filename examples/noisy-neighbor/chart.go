package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Colours of the chart: one per arm for the shading, and the lines.
var (
	armShade = map[string]color.Color{
		armSolo:         color.RGBA{R: 0xe4, G: 0xee, B: 0xfa, A: 0xff},
		armUncontrolled: color.RGBA{R: 0xfa, G: 0xd4, B: 0xd0, A: 0xff},
		armOneConn:      color.RGBA{R: 0xfa, G: 0xea, B: 0xc4, A: 0xff},
		armTimeout:      color.RGBA{R: 0xe8, G: 0xdc, B: 0xf4, A: 0xff},
		armPgtraffic:    color.RGBA{R: 0xd6, G: 0xf0, B: 0xd6, A: 0xff},
	}
	p99Colour   = color.RGBA{R: 0xc0, G: 0x30, B: 0x20, A: 0xff}
	p50Colour   = color.RGBA{R: 0x20, G: 0x60, B: 0xb0, A: 0xff}
	limitColour = color.RGBA{R: 0x30, G: 0x80, B: 0x30, A: 0xff}
	worseColour = color.RGBA{R: 0x90, G: 0x90, B: 0x90, A: 0xff}
	loadColour  = color.RGBA{R: 0x80, G: 0x50, B: 0x10, A: 0xff}
)

// window is one chart window: its middle (seconds since the experiment began) and the
// checkout latency quantiles inside it.
type window struct {
	mid      float64
	p50, p99 time.Duration
}

// windows cuts the arm's checkout samples into windows of width w, from the arm's start.
func (p *armResult) windows(w time.Duration) []window {
	var out []window
	byStart := slices.Clone(p.critical)
	slices.SortFunc(byStart, func(a, b sample) int { return int(a.at - b.at) })
	i := 0
	for from := p.start; from+w/2 <= p.end; from += w {
		to := min(from+w, p.end)
		var lat []time.Duration
		for ; i < len(byStart) && byStart[i].at < to; i++ {
			lat = append(lat, byStart[i].latency)
		}
		if len(lat) == 0 {
			continue
		}
		slices.Sort(lat)
		out = append(out, window{
			mid: (from + (to-from)/2).Seconds(),
			p50: quantile(lat, 0.50), p99: quantile(lat, 0.99),
		})
	}
	return out
}

// reportLoad is the reports' execution seconds per second in each window of width w: the
// average number of reports running at once.
func (p *armResult) reportLoad(w time.Duration) plotter.XYs {
	var out plotter.XYs
	for from := p.start; from+w/2 <= p.end; from += w {
		to := min(from+w, p.end)
		var busy time.Duration
		for k, s := range p.noiseStarts {
			if lo, hi := max(s, from), min(p.noiseFinishes[k], to); hi > lo {
				busy += hi - lo
			}
		}
		out = append(out, plotter.XY{X: (from + (to-from)/2).Seconds(), Y: busy.Seconds() / (to - from).Seconds()})
	}
	return out
}

// writeChart draws two panels sharing the time axis: the checkout p50 and p99 per window (log
// scale, with the 1.5× and 3× solo p99 lines), and the reports' load per window; each arm's runs
// are shaded in its colour, named in the bottom panel's legend. It writes a PNG to path.
func writeChart(path string, r *results, w time.Duration) error {
	if len(r.runs) == 0 {
		return fmt.Errorf("noisy-neighbor: chart: no arm ran")
	}
	if !strings.EqualFold(filepath.Ext(path), ".png") {
		return fmt.Errorf("noisy-neighbor: chart: %s: want a .png file", path)
	}
	solo := r.soloP99()
	first, last := r.runs[0].start.Seconds(), r.runs[len(r.runs)-1].end.Seconds()
	// Room on the right for the arms' legend, off the data.
	xMax := last + (last-first)*0.12

	// One line per run, so that the unmeasured pauses between runs stay gaps.
	var p50s, p99s, loads []plotter.XYs
	lo, hi := solo, solo*time.Duration(targetUncontrolled)
	maxLoad := 1.0
	for _, p := range r.runs {
		var p50, p99 plotter.XYs
		for _, win := range p.windows(w) {
			p50 = append(p50, plotter.XY{X: win.mid, Y: msf(win.p50)})
			p99 = append(p99, plotter.XY{X: win.mid, Y: msf(win.p99)})
			lo, hi = min(lo, win.p50), max(hi, win.p99)
		}
		p50s, p99s = append(p50s, p50), append(p99s, p99)
		load := p.reportLoad(w)
		for _, xy := range load {
			maxLoad = max(maxLoad, xy.Y)
		}
		loads = append(loads, load)
	}
	yLo, yHi := msf(lo)/1.5, msf(hi)*1.5

	top := plot.New()
	top.Title.Text = fmt.Sprintf("Checkout latency beside a reporting workload (per %v window)", w)
	top.Title.TextStyle.Font.Size = vg.Points(13)
	top.Y.Label.Text = "checkout latency (ms, log scale)"
	top.Y.Scale = plot.LogScale{}
	top.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	top.Y.Min, top.Y.Max = yLo, yHi
	top.X.Min, top.X.Max = first, xMax
	top.X.Tick.Label.Font.Size = 0 // the bottom panel labels the shared time axis
	top.Add(plotter.NewGrid())
	bottom := plot.New()
	bottom.X.Label.Text = "time (s)"
	bottom.Y.Label.Text = "reports running (mean)"
	bottom.X.Min, bottom.X.Max = first, xMax
	bottom.Y.Min, bottom.Y.Max = 0, maxLoad*1.15
	bottom.Add(plotter.NewGrid())

	legendShade := map[string]*plotter.Polygon{}
	for _, p := range r.runs {
		x0, x1 := p.start.Seconds(), p.end.Seconds()
		for _, pl := range []struct {
			p      *plot.Plot
			y0, y1 float64
		}{{top, yLo, yHi}, {bottom, 0, maxLoad * 1.15}} {
			shade, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: pl.y0}, {X: x1, Y: pl.y0}, {X: x1, Y: pl.y1}, {X: x0, Y: pl.y1}})
			if err != nil {
				return fmt.Errorf("noisy-neighbor: chart: %w", err)
			}
			shade.Color = armShade[p.name]
			shade.LineStyle.Width = 0
			pl.p.Add(shade)
			legendShade[p.name] = shade
		}
	}
	for _, name := range armNames {
		if s, ok := legendShade[name]; ok {
			bottom.Legend.Add(name, s)
		}
	}
	bottom.Legend.Top = true
	bottom.Legend.Left = false
	bottom.Legend.XOffs = -vg.Points(6)
	bottom.Legend.TextStyle.Font.Size = vg.Points(10)
	bottom.Legend.ThumbnailWidth = vg.Points(14)

	hline := func(y float64, c color.Color, dashed bool) (*plotter.Line, error) {
		l, err := plotter.NewLine(plotter.XYs{{X: first, Y: y}, {X: last, Y: y}})
		if err != nil {
			return nil, fmt.Errorf("noisy-neighbor: chart: %w", err)
		}
		l.Color, l.Width = c, vg.Points(1.2)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
		}
		return l, nil
	}
	limit, err := hline(msf(solo)*targetControlled, limitColour, true)
	if err != nil {
		return err
	}
	worse, err := hline(msf(solo)*targetUncontrolled, worseColour, true)
	if err != nil {
		return err
	}
	top.Add(limit, worse)
	var p50Line, p99Line *plotter.Line
	for i := range p99s {
		if len(p99s[i]) == 0 {
			continue
		}
		if p99Line, err = plotter.NewLine(p99s[i]); err != nil {
			return fmt.Errorf("noisy-neighbor: chart: %w", err)
		}
		p99Line.Color, p99Line.Width = p99Colour, vg.Points(1.8)
		if p50Line, err = plotter.NewLine(p50s[i]); err != nil {
			return fmt.Errorf("noisy-neighbor: chart: %w", err)
		}
		p50Line.Color, p50Line.Width = p50Colour, vg.Points(1.4)
		top.Add(p50Line, p99Line)
	}
	if p99Line != nil {
		top.Legend.Add("p99", p99Line)
		top.Legend.Add("p50", p50Line)
	}
	top.Legend.Add(fmt.Sprintf("%.1f× solo p99 (target under pgtraffic)", targetControlled), limit)
	top.Legend.Add(fmt.Sprintf("%.0f× solo p99", targetUncontrolled), worse)
	top.Legend.Top = true
	top.Legend.Left = false
	top.Legend.XOffs = -vg.Points(6)
	top.Legend.YOffs = -vg.Points(4)
	top.Legend.TextStyle.Font.Size = vg.Points(10)

	for _, load := range loads {
		l, err := plotter.NewLine(load)
		if err != nil {
			return fmt.Errorf("noisy-neighbor: chart: %w", err)
		}
		l.Color, l.Width = loadColour, vg.Points(1.4)
		bottom.Add(l)
	}

	const width, height = 10 * vg.Inch, 6.5 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(96))
	dc := draw.New(img)
	pad := vg.Points(6)
	split := height * 0.32
	topC := draw.Crop(dc, pad, -pad, split, -pad)
	bottomC := draw.Crop(dc, pad, -pad, pad, split-height)
	alignX(top, topC, bottom, bottomC).draw()

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("noisy-neighbor: chart: %w", err)
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("noisy-neighbor: chart: %w", err)
	}
	return nil
}

// aligned is two plots with the canvases that line up their data areas.
type aligned struct {
	a, b   *plot.Plot
	ac, bc draw.Canvas
}

func (x aligned) draw() {
	x.a.Draw(x.ac)
	x.b.Draw(x.bc)
}

// alignX narrows one canvas or the other so that both plots' data areas span the same x range,
// whatever the widths of their y-axis labels.
func alignX(a *plot.Plot, ac draw.Canvas, b *plot.Plot, bc draw.Canvas) aligned {
	ad, bd := a.DataCanvas(ac), b.DataCanvas(bc)
	left := max(ad.Min.X, bd.Min.X)
	right := min(ad.Max.X, bd.Max.X)
	ac = draw.Crop(ac, left-ad.Min.X, right-ad.Max.X, 0, 0)
	bc = draw.Crop(bc, left-bd.Min.X, right-bd.Max.X, 0, 0)
	return aligned{a: a, b: b, ac: ac, bc: bc}
}

// msf is d in milliseconds.
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
