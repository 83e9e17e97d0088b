// SPDX-License-Identifier: MIT

//go:build !linux

package capture

import "errors"

func openTAP(name string) (*tapWriter, error) {
	return nil, errors.New("tap devices are only supported on Linux")
}
