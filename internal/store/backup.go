// SPDX-License-Identifier: MIT

package store

import (
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"
)

// WriteTo writes a consistent copy of the whole database to w, taken in
// one read transaction, while the store stays in use (airlock gateway
// backup). The copy opens with Open like the original.
func (s *Store) WriteTo(w io.Writer) (int64, error) {
	var n int64
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("back up %s: %w", s.path, err)
	}
	return n, nil
}
