package proxy

import "time"

// ceilingProbeTimeout bounds how long the start waits for the servers'
// item counts, unless Options.StartProbeTimeout says otherwise.
const ceilingProbeTimeout = 2 * time.Second

// startCeilings sets the ceilings (throttle.ReadCost) of the buckets
// without one saved for their epoch, before the proxy serves: class 1 when every upstream server reports curr_items 0
// (nothing stored: every value of every bucket will be written through
// the proxy, which raises the ceiling before it forwards), else they stay
// at the largest item (M), as the engine starts them. Buckets created
// later start the same way (startClass).
func (srv *Server) startCeilings() {
	n, err := srv.pool.CurrItems(srv.opts.startProbe)
	if err != nil || n != 0 {
		ev := srv.log.Info()
		if err != nil {
			ev = ev.Err(err)
		}
		ev.Int64("curr_items", n).Msg("servers not known to be empty: reads are billed the largest item until a FLUSH")
		return
	}
	srv.startClass.Store(1)
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	for name, b := range srv.ten.Load().buckets {
		if c, ok := srv.state.Ceilings[name]; ok && c.Epoch == b.gen.Load() {
			continue // its saved class holds
		}
		b.tb.ReadCost().Reset(b.gen.Load())
		b.savedCeil.Store(1)
	}
}
