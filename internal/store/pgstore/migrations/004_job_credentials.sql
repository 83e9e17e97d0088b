-- Version 4: a job credential (root's MUNGE credential from the SPANK
-- plugin, which attests the batch job id) admits one job in the whole
-- fleet, not one per member: each member's munged has a replay cache of
-- its own. The gateway that admits a job with one claims its SHA-256 here
-- (the member id and lease); another member refuses it. Claims are kept a
-- day, longer than any such credential lives.
create table airlock_job_credentials (
	hash     bytea primary key,
	gateway  text not null,
	lease_id text not null,
	claimed  timestamptz not null default now(),
	expires  timestamptz not null,
	writer   name default current_user
);
create index airlock_job_credentials_expires on airlock_job_credentials (expires);

alter table airlock_job_credentials enable row level security;
create policy gateway_read on airlock_job_credentials for select to airlock_fleet_gateway using (true);
create policy gateway_insert on airlock_job_credentials for insert to airlock_fleet_gateway
	with check (writer = current_user and gateway in (select airlock_own_members()));
create policy gateway_delete on airlock_job_credentials for delete to airlock_fleet_gateway using (expires < now());
create policy admin_all on airlock_job_credentials to airlock_fleet_admin using (true) with check (true);
