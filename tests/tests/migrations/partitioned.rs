//! PostgreSQL's generation layout, a third set of migrations.

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_migrations::MigrationHarness;
    use inbox_runtime::migrations::with_inbox;
    use inbox_runtime::prune::partitioned;
    use inbox_tests::Postgres;

    use crate::support::*;

    /// PostgreSQL's generation layout is a third set: `.and(...)` adds it, and
    /// everything reverts together (the layout first, it is the newest inbox set).
    #[test]
    fn partitioned_layout_runs_and_reverts_with_the_rest() {
        let Some((_db, mut conn)) = empty::<Postgres>() else {
            return;
        };
        let all = || with_inbox(APP).and(partitioned::MIGRATIONS);
        let ran = conn
            .run_pending_migrations(all())
            .expect("run three sets")
            .len();
        let mut expected = all_versions::<diesel::pg::Pg>();
        expected.extend(versions::<diesel::pg::Pg>(&partitioned::MIGRATIONS));
        assert_eq!(ran, expected.len());
        assert!(table_exists(&mut conn, "inbox_generations"));
        assert_inbox_works(&mut conn, "p-1");

        assert_eq!(
            conn.revert_all_migrations(all())
                .expect("revert three sets")
                .len(),
            expected.len()
        );
        assert!(!table_exists(&mut conn, "inbox_generations"));
        assert!(!table_exists(&mut conn, "inbox_messages_archive"));
        assert_nothing_left(&mut conn);
    }
}
