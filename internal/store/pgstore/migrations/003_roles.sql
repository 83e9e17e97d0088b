-- Version 3: a gateway's password is not the keys to the site. Two group
-- roles (NOLOGIN; login roles are made members of them by airlock db
-- migrate --gateway-role/--admin-role, grants.go): airlock_fleet_gateway
-- holds what a gateway needs, airlock_fleet_admin what an admin host
-- needs. The table-level grants are grants.go's (applied after every
-- migration, so a table a later migration adds is granted too); this
-- migration adds the row-level security of the tables that gateways share.
--
-- Rows a gateway writes carry its login role (writer, default
-- current_user): a gateway's role may change only its own lease records,
-- attribution and member record, may answer only the kicks and capture
-- tickets addressed to its own member id, and may add bans but not lift
-- them. Rows of before this version have no writer: the first gateway
-- role that updates one (its own lease, its own member record) takes it.
-- The schema's owner and superusers are not subject to these policies.
--
-- The owner needs CREATEROLE to make the two roles, unless a DBA made them
-- first (then nothing is made, and an owner without CREATEROLE migrates).
do $$
begin
	if not exists (select from pg_roles where rolname = 'airlock_fleet_gateway') then
		begin
			create role airlock_fleet_gateway nologin;
		exception when duplicate_object or unique_violation then null;
		end;
	end if;
	if not exists (select from pg_roles where rolname = 'airlock_fleet_admin') then
		begin
			create role airlock_fleet_admin nologin;
		exception when duplicate_object or unique_violation then null;
		end;
	end if;
end
$$;

alter table airlock_leases add column writer name;
alter table airlock_leases alter column writer set default current_user;
alter table airlock_gateways add column writer name;
alter table airlock_gateways alter column writer set default current_user;
alter table airlock_bans add column writer name;
alter table airlock_bans alter column writer set default current_user;
alter table airlock_kicks add column writer name;
alter table airlock_kicks alter column writer set default current_user;
alter table airlock_captures add column writer name;
alter table airlock_captures alter column writer set default current_user;

-- The member ids whose gateway role is the current user.
create function airlock_own_members() returns setof text language sql stable as $$
	select id from airlock_gateways where writer = current_user
$$;

-- The widest port block only grows (whois looks that far below a port):
-- a role that may record leases cannot hide attribution by shrinking it.
create function airlock_meta_grow() returns trigger language plpgsql as $$
begin
	if NEW.key = 'max_block_span' and NEW.value < OLD.value then
		NEW.value := OLD.value;
	end if;
	return NEW;
end
$$;
create trigger airlock_meta_grow before update on airlock_meta
	for each row execute function airlock_meta_grow();

alter table airlock_leases enable row level security;
create policy gateway_read on airlock_leases for select to airlock_fleet_gateway using (true);
create policy gateway_insert on airlock_leases for insert to airlock_fleet_gateway with check (writer = current_user);
create policy gateway_update on airlock_leases for update to airlock_fleet_gateway
	using (writer = current_user or writer is null) with check (writer = current_user);
create policy gateway_delete on airlock_leases for delete to airlock_fleet_gateway using (writer = current_user);
create policy admin_all on airlock_leases to airlock_fleet_admin using (true) with check (true);

alter table airlock_attribution enable row level security;
create policy gateway_read on airlock_attribution for select to airlock_fleet_gateway using (true);
create policy gateway_insert on airlock_attribution for insert to airlock_fleet_gateway
	with check (exists (select 1 from airlock_leases l where l.id = lease_id and l.writer = current_user));
create policy admin_all on airlock_attribution to airlock_fleet_admin using (true) with check (true);

alter table airlock_gateways enable row level security;
create policy gateway_read on airlock_gateways for select to airlock_fleet_gateway using (true);
-- At most 16 member records per gateway role (a gateway whose state
-- directory was made again registers anew): a stolen password cannot fill
-- the table that every gateway reads at each heartbeat.
create policy gateway_insert on airlock_gateways for insert to airlock_fleet_gateway
	with check (writer = current_user and (select count(*) from airlock_gateways g where g.writer = current_user) < 16);
create policy gateway_update on airlock_gateways for update to airlock_fleet_gateway
	using (writer = current_user or writer is null) with check (writer = current_user);
create policy admin_all on airlock_gateways to airlock_fleet_admin using (true) with check (true);

alter table airlock_bans enable row level security;
create policy gateway_read on airlock_bans for select to airlock_fleet_gateway using (true);
create policy gateway_insert on airlock_bans for insert to airlock_fleet_gateway with check (writer = current_user);
-- Only bans that ended a day ago go (AddBan's cleanup); none is lifted.
create policy gateway_delete on airlock_bans for delete to airlock_fleet_gateway using (until < now() - interval '1 day');
create policy admin_all on airlock_bans to airlock_fleet_admin using (true) with check (true);

alter table airlock_kicks enable row level security;
create policy gateway_read on airlock_kicks for select to airlock_fleet_gateway using (true);
create policy gateway_insert on airlock_kicks for insert to airlock_fleet_gateway with check (writer = current_user);
create policy gateway_update on airlock_kicks for update to airlock_fleet_gateway
	using (gateway in (select airlock_own_members())) with check (gateway in (select airlock_own_members()));
create policy admin_all on airlock_kicks to airlock_fleet_admin using (true) with check (true);

-- A capture ticket is a wiretap: only an admin writes one; a gateway sees
-- and takes only those addressed to it.
alter table airlock_captures enable row level security;
create policy gateway_read on airlock_captures for select to airlock_fleet_gateway using (gateway in (select airlock_own_members()));
create policy gateway_update on airlock_captures for update to airlock_fleet_gateway
	using (gateway in (select airlock_own_members())) with check (gateway in (select airlock_own_members()));
create policy admin_all on airlock_captures to airlock_fleet_admin using (true) with check (true);
