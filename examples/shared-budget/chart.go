package main

import (
	"fmt"
	"image/color"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// chartLines are the scenarios drawn, with their colours: the rate budget's runs.
var chartLines = []struct {
	scenario string
	colour   color.Color
}{
	{"single", color.RGBA{R: 0x90, G: 0x90, B: 0x90, A: 0xff}},
	{"equal", color.RGBA{R: 0x20, G: 0x60, B: 0xb0, A: 0xff}},
	{"10:1", color.RGBA{R: 0x30, G: 0x90, B: 0x30, A: 0xff}},
	{"sigstop", color.RGBA{R: 0xc0, G: 0x30, B: 0x20, A: 0xff}},
	{"restart", color.RGBA{R: 0x80, G: 0x50, B: 0x10, A: 0xff}},
}

// writeChart draws, for the median run of each rate scenario, the execution seconds admitted
// in each second since the run began, against the rate and rate + burst, with the warm-up
// and the chaos (redis stopped, or restarted) marked. It writes a PNG to path.
func writeChart(path string, c config, results []result) error {
	if !strings.EqualFold(filepath.Ext(path), ".png") {
		return fmt.Errorf("shared-budget: chart: %s: want a .png file", path)
	}
	rate := c.share
	p := plot.New()
	p.Title.Text = fmt.Sprintf("One budget shared by %d processes through Redis (median of %d runs each)", c.procs, c.runs)
	p.X.Label.Text = "seconds since the run began"
	p.Y.Label.Text = "execution seconds admitted per second"
	p.Add(plotter.NewGrid())
	top := rate + c.burst.Seconds()
	span := c.duration.Seconds()
	mark := func(label string, x0, x1 float64, shade color.Color) error {
		poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: 0}, {X: x1, Y: 0}, {X: x1, Y: top * 1.05}, {X: x0, Y: top * 1.05}})
		if err != nil {
			return err
		}
		poly.Color, poly.LineStyle.Width = shade, 0
		p.Add(poly)
		p.Legend.Add(label, poly)
		return nil
	}
	if err := mark("warm-up (not measured)", 0, c.warmup.Seconds(), color.RGBA{R: 0xee, G: 0xee, B: 0xee, A: 0xff}); err != nil {
		return err
	}
	at := c.chaosAt.Seconds()
	if err := mark("sigstop: redis stopped", at, at+c.chaosFor.Seconds(), color.RGBA{R: 0xfb, G: 0xe3, B: 0xe0, A: 0xff}); err != nil {
		return err
	}
	for _, l := range []struct {
		label string
		y     float64
		dash  bool
	}{{"rate", rate, false}, {"rate + burst", top, true}} {
		line, err := plotter.NewLine(plotter.XYs{{X: 0, Y: l.y}, {X: span, Y: l.y}})
		if err != nil {
			return err
		}
		line.Color = color.Black
		if l.dash {
			line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(line)
		p.Legend.Add(l.label, line)
	}
	for _, cl := range chartLines {
		for _, r := range results {
			if r.scenario != cl.scenario || len(r.perSecond) == 0 {
				continue
			}
			var xy plotter.XYs
			for i, v := range r.perSecond {
				xy = append(xy, plotter.XY{X: float64(i) + 0.5, Y: v})
			}
			line, err := plotter.NewLine(xy)
			if err != nil {
				return err
			}
			line.Color, line.Width = cl.colour, vg.Points(1.5)
			p.Add(line)
			p.Legend.Add(cl.scenario, line)
		}
	}
	p.X.Min, p.X.Max = 0, span
	p.Y.Min, p.Y.Max = 0, top*1.05
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Legend.ThumbnailWidth = vg.Points(14)
	if err := p.Save(26*vg.Centimeter, 13*vg.Centimeter, path); err != nil {
		return fmt.Errorf("shared-budget: chart: %w", err)
	}
	return nil
}
