package invariant

// Counts sums up a set of requests.
type Counts struct {
	Requests int `json:"requests"`
	Admitted int `json:"admitted"`
	Limited  int `json:"limited"`
	Errors   int `json:"errors"`
}

func (c *Counts) add(r Request) {
	c.Requests++
	switch {
	case r.Admitted():
		c.Admitted++
	case r.Limited():
		c.Limited++
	case r.Failed():
		c.Errors++
	}
}

// Totals are a run's counts: overall, by route, by phase (of t_recv;
// requests received outside every phase are only in the overall counts) and
// by the mode that decided.
type Totals struct {
	Counts
	ByRoute map[string]Counts `json:"by_route"`
	ByPhase map[string]Counts `json:"by_phase"`
	ByMode  map[string]int    `json:"by_mode"`
}

// ComputeTotals counts reqs.
func ComputeTotals(reqs []Request, phases []Phase) Totals {
	t := Totals{ByRoute: map[string]Counts{}, ByPhase: map[string]Counts{}, ByMode: map[string]int{}}
	ps := spans(phases)
	for _, r := range reqs {
		t.Counts.add(r)
		c := t.ByRoute[r.Route]
		c.add(r)
		t.ByRoute[r.Route] = c
		if i := phaseOf(ps, recvUS(r)); i >= 0 {
			c := t.ByPhase[ps[i].name]
			c.add(r)
			t.ByPhase[ps[i].name] = c
		}
		mode := r.Mode
		if mode == "" {
			mode = "none"
		}
		t.ByMode[mode]++
	}
	return t
}
