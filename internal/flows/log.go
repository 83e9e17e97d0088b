// SPDX-License-Identifier: MIT

package flows

import (
	"encoding/json"
	"fmt"
	"sync"

	"gopkg.in/natefinch/lumberjack.v2"
)

// Defaults of the flow log's rotation.
const (
	DefaultLogMaxMB      = 100
	DefaultLogMaxBackups = 10
)

// Log writes flow records as JSON lines to a file that is rotated by size
// (gopkg.in/natefinch/lumberjack.v2): when a record would grow the file
// past MaxMB megabytes, it is renamed with a timestamp
// (flows-2026-11-23T05-50-00.000.log) and a new file begins; at most
// MaxBackups old files are kept. The file is created 0600. It is safe for
// concurrent use.
type Log struct {
	mu sync.Mutex
	lj *lumberjack.Logger
}

// OpenLog opens (creating if needed) the flow log at path. maxMB and
// maxBackups of 0 mean the defaults.
func OpenLog(path string, maxMB, maxBackups int) (*Log, error) {
	if maxMB < 0 || maxBackups < 0 {
		return nil, fmt.Errorf("flow log %s: negative size or backup count", path)
	}
	if maxMB == 0 {
		maxMB = DefaultLogMaxMB
	}
	if maxBackups == 0 {
		maxBackups = DefaultLogMaxBackups
	}
	l := &Log{lj: &lumberjack.Logger{Filename: path, MaxSize: maxMB, MaxBackups: maxBackups}}
	// Open now, so that a bad path fails at start, not at the first flow.
	if _, err := l.lj.Write(nil); err != nil {
		return nil, fmt.Errorf("open flow log: %w", err)
	}
	return l, nil
}

// WriteRecord appends r as one JSON line.
func (l *Log) WriteRecord(r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode flow record: %w", err)
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.lj.Write(b); err != nil {
		return fmt.Errorf("write flow log: %w", err)
	}
	return nil
}

// Close closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lj.Close()
}
