-- Version 2: live captures relayed through the fleet. An admin asks, on any
-- gateway or admin host, for a capture of a job that another gateway
-- holds: the request is a ticket here, addressed to the holding gateway
-- (its member id), with the SHA-256 of a secret that only the requester
-- knows. The requester presents the secret to the holding gateway over its
-- control API (TLS, pinned); the gateway takes the ticket (once, before it
-- expires) and streams the capture the record describes.
create table airlock_captures (
	id          bigserial primary key,
	lease_id    text not null,
	gateway     text not null,
	secret_hash bytea not null,
	requested   timestamptz not null default now(),
	expires     timestamptz not null,
	taken       timestamptz,
	record      jsonb not null
);
create index airlock_captures_expires on airlock_captures (expires);
