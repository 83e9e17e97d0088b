-- Airlock's shared state, version 1: join tokens, bans, the lease history
-- with its attribution index, the fleet's gateways and kick requests.
-- Records are JSON (the Go types of internal/store) beside the columns that
-- queries use, so that a field added to a record needs no migration.

create table airlock_tokens (
	name    text primary key,
	hash    bytea not null unique,
	created timestamptz not null,
	expires timestamptz,
	record  jsonb not null
);

create table airlock_bans (
	id     bigserial primary key,
	until  timestamptz not null,
	record jsonb not null
);
create index airlock_bans_until on airlock_bans (until);

create table airlock_leases (
	id      text primary key,
	gateway text not null,
	start   timestamptz not null,
	"end"   timestamptz,
	record  jsonb not null
);
create index airlock_leases_live on airlock_leases (gateway) where "end" is null;
create index airlock_leases_end on airlock_leases ("end");

-- Where each lease was seen outside: a public address with its port block,
-- or (own) the job's own address with any port.
create table airlock_attribution (
	lease_id    text not null references airlock_leases (id) on delete cascade,
	public_addr inet not null,
	port_lo     integer not null,
	port_hi     integer not null,
	own         boolean not null default false,
	start       timestamptz not null,
	primary key (public_addr, port_lo, start, lease_id)
);
create index airlock_attribution_lease on airlock_attribution (lease_id);

-- Single values: max_block_span is the widest port block ever recorded
-- (port_hi - port_lo), how far below a port whois must look.
create table airlock_meta (
	key   text primary key,
	value bigint not null
);

create table airlock_gateways (
	id        text primary key,
	heartbeat timestamptz not null,
	record    jsonb not null
);

create table airlock_kicks (
	id        bigserial primary key,
	lease_id  text not null,
	gateway   text not null,
	requested timestamptz not null default now(),
	record    jsonb not null,
	done      timestamptz,
	result    jsonb
);

-- Every change to tokens, bans and kicks is announced on channel
-- airlock as {"t": TABLE, "op": INSERT|UPDATE|DELETE, "key": KEY}, KEY
-- the column named by the trigger's argument; NOTIFY is sent at commit.
create function airlock_notify() returns trigger language plpgsql as $$
begin
	perform pg_notify('airlock', json_build_object(
		't', TG_TABLE_NAME, 'op', TG_OP,
		'key', coalesce(to_jsonb(NEW) ->> TG_ARGV[0], to_jsonb(OLD) ->> TG_ARGV[0]))::text);
	return null;
end
$$;
create trigger airlock_tokens_notify after insert or update or delete on airlock_tokens
	for each row execute function airlock_notify('name');
create trigger airlock_bans_notify after insert or update or delete on airlock_bans
	for each row execute function airlock_notify('id');
create trigger airlock_kicks_notify after insert on airlock_kicks
	for each row execute function airlock_notify('id');
