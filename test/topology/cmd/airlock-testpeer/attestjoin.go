// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/airlock-vpn/airlock/internal/attest"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// runAttestJoin is `airlock-testpeer attestjoin`: what a hostile job user
// can do with what it found (issue 25, items 1 and 2). It has the node's
// munged make one join credential for a fresh key, binding -job-cred (a
// job credential it found) if given, and joins the gateway with it -n
// times, claiming -claim-uid and -claim-job; it prints one line per
// attempt: "ok LEASE" or "refused CODE: MESSAGE".
func runAttestJoin(args []string) error {
	fs := flag.NewFlagSet("attestjoin", flag.ContinueOnError)
	gateway := fs.String("gateway", "", "HOST:PORT")
	pin := fs.String("pin", "", "sha256:HEX")
	socket := fs.String("socket", "", "munged socket")
	jobCred := fs.String("job-cred", "", "a job credential to bind and carry")
	claimJob := fs.String("claim-job", "", "batch job id to claim")
	claimUID := fs.Int("claim-uid", os.Getuid(), "uid to claim")
	token := fs.String("token", "", "join token, if any")
	n := fs.Int("n", 1, "joins with the one credential")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := control.NewClient(*gateway, *pin, 10*time.Second)
	if err != nil {
		return err
	}
	defer cc.Close()
	priv, err := wgkey.Generate()
	if err != nil {
		return err
	}
	cred, err := attest.MakeJoin(ctx, munge.Client{Socket: *socket}, cc.Pin(), priv.PublicKey(), *jobCred)
	if err != nil {
		return err
	}
	req := control.JoinRequest{Token: *token, PublicKey: priv.PublicKey(),
		Job:    control.JobInfo{UID: *claimUID, BatchJobID: *claimJob},
		Attest: &control.Attest{Munge: cred, MungeJob: *jobCred}}
	if *claimJob != "" {
		req.Job.BatchSystem = "slurm"
	}
	for range *n {
		l, err := cc.Join(ctx, req)
		if err != nil {
			code := "error"
			if ae := (*control.APIError)(nil); asAPIError(err, &ae) {
				code = ae.Code
			}
			fmt.Printf("refused %s: %v\n", code, err)
			continue
		}
		fmt.Printf("ok %s\n", l.ID)
		_ = cc.Release(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret})
	}
	return nil
}

func asAPIError(err error, ae **control.APIError) bool {
	for err != nil {
		if x, ok := err.(*control.APIError); ok {
			*ae = x
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}
