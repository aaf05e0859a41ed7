package invariant

import "slices"

// UncountedRows are the uncounted invariant, per judged phase: requests
// whose handler ran without a counted decision, over all instances, from
// their counters (uncounted_requests in /status) read as each phase began,
// and after settle (the final statuses). An instance whose counter went
// down between two readings was restarted: what its new incarnation
// counted is all of it that is known. A phase where no instance's counter
// was read at both ends is not measured, and fails.
func UncountedRows(phases []Phase, statuses []InstanceStatus) []Row {
	final := map[string]float64{}
	for _, st := range statuses {
		if !st.Final || st.Err != "" {
			continue
		}
		if v, ok := st.Body["uncounted_requests"].(float64); ok {
			final[st.Instance] = v
		}
	}
	var rows []Row
	for i, p := range phases {
		if !slices.Contains(JudgedPhases, p.Name) {
			continue
		}
		end := final
		if i+1 < len(phases) {
			end = phases[i+1].Uncounted
		}
		row := Row{Name: Uncounted, Route: AllRoutes, Phase: p.Name, Bound: 0}
		n, read := 0.0, false
		for inst, to := range end {
			from, ok := p.Uncounted[inst]
			if !ok {
				continue
			}
			read = true
			if to < from { // restarted meanwhile
				n += to
			} else {
				n += to - from
			}
		}
		if !read {
			row.Measured = "no instance's counter read at both ends of the phase"
		} else {
			row.Measured, row.Pass = n, n == 0
		}
		rows = append(rows, row)
	}
	return rows
}
