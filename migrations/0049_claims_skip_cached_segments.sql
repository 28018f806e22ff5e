-- A claim does not ship a segment the broker holds decompressed (issue 46).
--
-- A pop of one message reads one frame of its partition's head segment,
-- and the claim shipped the whole segment for it: a segment of 200
-- messages went from PostgreSQL to the broker 200 times (read from TOAST
-- each time: a zstd blob does not compress further, so past about 2 KB it is
-- stored out of line), while the broker kept it decompressed after the
-- first pop (`pop::frames`). The lease handover already says which segment
-- it holds (queen.ack_completed_many_v2's p_cached_base); the claims of one
-- partition now do too.
--
-- queen.pop_list_v2 is pop_list_v1 (0035_claim_reports_the_tail.sql) with
-- p_cached: for each candidate, in p_pids' order, the base offset of a
-- segment of that partition the broker holds, or NULL. A segment row whose
-- base offset is that one comes back with a NULL blob, and its blob is not
-- read at all. The claim itself is unchanged: same rows, same rules. The
-- broker answers from its own copy, which it holds from before the call.
--
-- queen.pop_list_shared_v2 is pop_list_shared_v1 (0048) over pop_list_v2,
-- with p_cached beside p_pids. The v1 functions stay for a broker of the
-- previous version during a rolling upgrade.

CREATE FUNCTION queen.pop_list_v2(
    p_pids           bigint[],
    p_cached         bigint[],
    p_group          text,
    p_worker         text,
    p_lease_seconds  integer,
    p_auto_ack       boolean,
    p_budget         integer,
    p_max_partitions integer,
    p_intent_mode    text,
    p_intent_from    timestamptz)
RETURNS SETOF queen.pop_row
LANGUAGE plpgsql AS $$
DECLARE
    v_now        timestamptz := clock_timestamp();
    v_left       integer := p_budget;
    v_claimed    integer := 0;
    v_committed  bigint;
    v_wanted     bigint;
    v_first      bigint;
    v_end        bigint;
    v_take       integer;
    v_attempt    integer;
    v_plain      boolean;
    k            record;
    s            record;
    r            record;
    v_row        queen.pop_row;
BEGIN
    FOR k IN
        SELECT u.pid, u.ord::integer AS ord, p.name AS pname, q.name AS qname, p.last_offset,
               COALESCE(q.window_buffer = 0 AND q.delayed_processing = 0, false) AS ungated,
               COALESCE(NULLIF(GREATEST(p_lease_seconds, 0), 0), q.lease_time, 60) AS lease
        FROM unnest(COALESCE(p_pids, '{}')) WITH ORDINALITY AS u (pid, ord)
        LEFT JOIN queen.partitions p ON p.id = u.pid  -- a vanished partition: the claim says 'empty'
        LEFT JOIN queen.queues q ON q.id = p.queue_id
        ORDER BY u.ord
    LOOP
        EXIT WHEN v_left <= 0 OR (p_max_partitions > 0 AND v_claimed >= p_max_partitions);
        v_plain := false;
        IF k.ungated THEN
            SELECT c.committed INTO v_committed FROM queen.consumers c
            WHERE c.partition_id = k.pid AND c.consumer_group = p_group
              AND (c.worker_id IS NULL OR c.lease_expires_at IS NULL OR c.lease_expires_at < v_now)
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                -- Leased, or locked by a concurrent pop: the claim's
                -- 'busy', said without a second lock attempt (under load
                -- most misses are this). A missing row goes to the claim.
                PERFORM 1 FROM queen.consumers c WHERE c.partition_id = k.pid AND c.consumer_group = p_group;
                IF FOUND THEN
                    v_row := (k.pid, k.pname, k.qname, 'busy', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
                    RETURN NEXT v_row;
                    CONTINUE;
                END IF;
            END IF;
            v_plain := FOUND AND k.last_offset > v_committed;
        END IF;
        IF v_plain THEN
            -- The segments from the one covering the next offset to the budget.
            v_wanted := v_committed + 1;
            v_first := NULL;
            FOR s IN
                SELECT g.base_offset, g.end_offset, g.msg_count, g.created_at,
                       CASE WHEN g.base_offset IS NOT DISTINCT FROM p_cached[k.ord] THEN NULL ELSE g.blob END AS blob
                FROM queen.segments g
                WHERE g.partition_id = k.pid AND g.base_offset <= v_wanted + v_left - 1
                  AND g.base_offset >= (SELECT h.base_offset FROM queen.segments h
                                        WHERE h.partition_id = k.pid AND h.base_offset <= v_wanted
                                        ORDER BY h.base_offset DESC LIMIT 1)
                ORDER BY g.base_offset
            LOOP
                IF v_first IS NULL AND s.end_offset < v_wanted THEN
                    EXIT; -- the next offset is in no segment (nothing emitted yet): the claim decides
                END IF;
                v_take := (LEAST(s.end_offset, v_wanted + v_left - 1) - GREATEST(s.base_offset, v_wanted) + 1)::integer;
                v_first := COALESCE(v_first, v_wanted);
                v_end := GREATEST(s.base_offset, v_wanted) + v_take - 1;
                v_row := (k.pid, k.pname, k.qname, 'segment', s.base_offset,
                          GREATEST(v_wanted - s.base_offset, 0)::integer, v_take, s.created_at, s.blob,
                          NULL, NULL, NULL, s.msg_count);
                RETURN NEXT v_row; -- rows go out when the function ends, after the update
            END LOOP;
            v_plain := v_first IS NOT NULL;
        END IF;
        IF v_plain THEN
            IF p_auto_ack THEN
                UPDATE queen.consumers c SET
                    committed = v_end, worker_id = NULL, lease_expires_at = NULL, lease_acquired_at = NULL,
                    batch_end = NULL, total_consumed = c.total_consumed + (v_end - v_first + 1),
                    last_consumed_at = v_now, retry_count = 0
                WHERE c.partition_id = k.pid AND c.consumer_group = p_group;
                v_attempt := 1;
            ELSE
                UPDATE queen.consumers c SET
                    worker_id = p_worker,
                    lease_expires_at = v_now + make_interval(secs => k.lease),
                    lease_acquired_at = v_now,
                    batch_end = v_end,
                    attempt_count = CASE WHEN c.attempt_offset IS NOT DISTINCT FROM v_first
                                         THEN c.attempt_count + 1 ELSE 1 END,
                    attempt_offset = v_first
                WHERE c.partition_id = k.pid AND c.consumer_group = p_group
                RETURNING c.attempt_count INTO v_attempt;
            END IF;
            v_row := (k.pid, k.pname, k.qname, 'claimed', k.last_offset, NULL, NULL, NULL, NULL,
                      v_first, v_end, v_attempt, NULL);
            RETURN NEXT v_row;
            v_claimed := v_claimed + 1;
            v_left := v_left - (v_end - v_first + 1)::integer;
            CONTINUE;
        END IF;
        -- Everything else: the full claim (it re-reads the row this
        -- transaction may already hold; same transaction, no wait).
        FOR r IN SELECT * FROM queen.pop_claim_v1(k.pid, p_group, p_worker, p_lease_seconds, p_auto_ack,
                                                  v_left, p_intent_mode, p_intent_from, false) LOOP
            v_row := (k.pid, k.pname, k.qname, r.o_kind,
                      CASE WHEN r.o_kind = 'claimed' THEN k.last_offset ELSE r.o_base_offset END, r.o_start_idx, r.o_take,
                      r.o_created_at, r.o_blob, r.o_first, r.o_last, r.o_attempt, r.o_msg_count);
            RETURN NEXT v_row;
            IF r.o_kind = 'claimed' THEN
                v_claimed := v_claimed + 1;
                v_left := v_left - (r.o_last - r.o_first + 1)::integer;
            END IF;
        END LOOP;
    END LOOP;
END
$$;

CREATE FUNCTION queen.pop_list_shared_v2(
    p_ends           integer[],
    p_pids           bigint[],
    p_cached         bigint[],
    p_groups         text[],
    p_workers        text[],
    p_lease_seconds  integer[],
    p_auto_ack       boolean[],
    p_budgets        integer[],
    p_max_partitions integer[],
    p_intent_modes   text[],
    p_intent_froms   timestamptz[])
RETURNS TABLE (o_slot integer, o_partition_id bigint, o_partition text, o_queue text, o_kind text,
               o_base_offset bigint, o_start_idx integer, o_take integer, o_created_at timestamptz,
               o_blob bytea, o_first bigint, o_last bigint, o_attempt integer, o_msg_count integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_from integer := 1;
BEGIN
    FOR i IN 1..COALESCE(cardinality(p_ends), 0) LOOP
        RETURN QUERY SELECT i, r.* FROM queen.pop_list_v2(
            p_pids[v_from:p_ends[i]], p_cached[v_from:p_ends[i]], p_groups[i], p_workers[i], p_lease_seconds[i],
            p_auto_ack[i], p_budgets[i], p_max_partitions[i], p_intent_modes[i], p_intent_froms[i]) r;
        v_from := p_ends[i] + 1;
    END LOOP;
END
$$;
