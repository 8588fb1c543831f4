package proxy

import (
	"encoding/binary"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// supportedFeatures are the HELLO features the proxy acknowledges.
var supportedFeatures = map[mc.Feature]bool{
	mc.FeatureTCPNoDelay:                true,
	mc.FeatureSelectBucket:              true,
	mc.FeatureNonBlockingThrottlingMode: true,
	mc.FeatureReportUnitUsage:           true,
}

// hello answers HELLO with the requested features the proxy supports, in
// the order asked, without duplicates.
func (s *session) hello(r *request) {
	v := r.value
	if len(v)%2 != 0 {
		s.localStatus(r, mc.StatusEinval, "HELLO value must be a list of 16-bit features")
		return
	}
	var acked []byte
	seen := map[mc.Feature]bool{}
	s.nonBlocking, s.reportUnits = false, false // HELLO replaces the feature set
	for i := 0; i+1 < len(v); i += 2 {
		ft := mc.Feature(binary.BigEndian.Uint16(v[i:]))
		if supportedFeatures[ft] && !seen[ft] {
			seen[ft] = true
			switch ft {
			case mc.FeatureNonBlockingThrottlingMode:
				s.nonBlocking = true
			case mc.FeatureReportUnitUsage:
				s.reportUnits = true
			}
			acked = binary.BigEndian.AppendUint16(acked, uint16(ft))
		}
	}
	s.localValue(r, mc.StatusSuccess, acked)
}
