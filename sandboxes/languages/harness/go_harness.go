// Package harness is fixlab's Go test runner (package fixlab/harness, compiled once by sandboxes/languages/go.py).
// The tests' main calls Run with the task's Test functions; Run runs them with the testing package's own runner
// (testing.MainStart, as go test's generated main does) and writes the run's proof only after every one of them
// returned and the runner reported success. The candidate's package cannot import this one, nor os, nor testing.
package harness

import (
	"encoding/hex"
	"errors"
	"io"
	"os"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

// deps stands in for go test's testing/internal/testdeps, without profiling, fuzzing or test logs (which would
// link in the fuzzer and pprof for nothing): the tests here never ask for them.
type deps struct{}

var errUnsupported = errors.New("not supported by fixlab's harness")

type corpusEntry = struct {
	Parent     string
	Path       string
	Data       []byte
	Values     []any
	Generation int
	IsSeed     bool
}

func (deps) ImportPath() string                          { return "" }
func (deps) MatchString(pat, str string) (bool, error)  { return true, nil }
func (deps) SetPanicOnExit0(bool)                        {}
func (deps) StartCPUProfile(io.Writer) error             { return errUnsupported }
func (deps) StopCPUProfile()                             {}
func (deps) StartTestLog(io.Writer)                      {}
func (deps) StopTestLog() error                          { return nil }
func (deps) WriteProfileTo(string, io.Writer, int) error { return errUnsupported }
func (deps) CoordinateFuzzing(time.Duration, int64, time.Duration, int64, int, []corpusEntry, []reflect.Type,
	string, string) error {
	return errUnsupported
}
func (deps) RunFuzzWorker(func(corpusEntry) error) error { return errUnsupported }
func (deps) ReadCorpus(string, []reflect.Type) ([]corpusEntry, error) {
	return nil, errUnsupported
}
func (deps) CheckCorpus([]any, []reflect.Type) error { return errUnsupported }
func (deps) ResetCoverage()                          {}
func (deps) SnapshotCoverage()                       {}

// Run never returns: exit 0 with the proof on fd 3 (the secret read from fd 4), or exit 1.
func Run(tests []testing.InternalTest) {
	var finished int32
	wrapped := make([]testing.InternalTest, len(tests))
	for i, t := range tests {
		f := t.F
		// counted only when the test function returns (t.FailNow and panics end it earlier)
		wrapped[i] = testing.InternalTest{Name: t.Name, F: func(t *testing.T) { f(t); atomic.AddInt32(&finished, 1) }}
	}
	m := testing.MainStart(deps{}, wrapped, nil, nil, nil)
	rc := m.Run()
	if rc != 0 || len(tests) == 0 || int(atomic.LoadInt32(&finished)) != len(tests) {
		os.Exit(1)
	}
	secret := make([]byte, 32)
	if _, err := io.ReadFull(os.NewFile(4, "secret"), secret); err != nil {
		os.Exit(70)
	}
	if _, err := os.NewFile(3, "proof").Write([]byte("P:" + hex.EncodeToString(secret) + "\n")); err != nil {
		os.Exit(70)
	}
	os.Exit(0)
}
