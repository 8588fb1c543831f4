package testmc

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Get GETs url and returns the answer's status code, body and header. The
// test fails if there is no answer or its body cannot be read.
func Get(t testing.TB, url string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body), resp.Header
}

// Scrape GETs url (a Prometheus /metrics endpoint) and returns the body.
// The test fails unless the answer is 200 OK.
func Scrape(t testing.TB, url string) string {
	t.Helper()
	code, body, _ := Get(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s\n%s", url, code, http.StatusText(code), body)
	}
	return body
}

// ParseMetrics parses text in the Prometheus text format, with the
// classic metric and label name rules, into its families by name. The
// test fails on a parse error.
func ParseMetrics(t testing.TB, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse scrape: %v\n%s", err, text)
	}
	return mfs
}

// SeriesValue returns the value of the series of family name whose labels
// are exactly labels (name, value pairs): a counter's or a gauge's value,
// a histogram's sample count. The test fails when there is no such family
// or series, or the family is of another type.
func SeriesValue(t testing.TB, mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	mf := mfs[name]
	if mf == nil {
		t.Fatalf("%s missing", name)
	}
next:
	for _, m := range mf.GetMetric() {
		if len(m.GetLabel())*2 != len(labels) {
			continue
		}
		for _, lp := range m.GetLabel() {
			i := slices.Index(labels, lp.GetName())
			if i < 0 || i%2 != 0 || labels[i+1] != lp.GetValue() {
				continue next
			}
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount())
		}
		t.Fatalf("%s: unexpected type %v", name, mf.GetType())
	}
	t.Fatalf("%s%v: no such series", name, labels)
	return 0
}
