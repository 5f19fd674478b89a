import GRDB
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// The schema of the shared-database tests and their `baton-harness db-test` workers, defined
/// once: a table `item` written by numbered writers, and a `creation_log` that records which
/// process ran the migration.
package enum TestSchema {
    /// - Parameter slow: sleep 0.3 s inside the migration (to test concurrent first opens).
    package static func migrator(slow: Bool = false) -> DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            if slow { usleep(300_000) }
            try db.execute(sql: """
                CREATE TABLE item (id INTEGER PRIMARY KEY, writer INTEGER NOT NULL, seq INTEGER NOT NULL, text TEXT, UNIQUE(writer, seq));
                CREATE TABLE creation_log (pid INTEGER NOT NULL);
                """)
            try db.execute(sql: "INSERT INTO creation_log(pid) VALUES (?)", arguments: [Int(getpid())])
        }
        return migrator
    }
}
