package cdc.sqlserver;

import java.util.Arrays;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

import org.apache.spark.SparkConf;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.catalog.CatalogTable;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.connector.catalog.CatalogPlugin;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.execution.command.SetCommand;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;

import scala.Option;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The SQL server's read-only rule (spark.sql.extensions): every statement a session analyzes is checked
 * before it runs, and anything that is not a read is refused. An allow-list, not a deny-list: a plan whose
 * root is a command runs only if that command reads (SHOW, DESCRIBE, EXPLAIN, USE, SET of a few keys); a
 * plan that is a query runs only if it reads named tables of the server's catalogs (no file path, no other
 * catalog), has no script transform (TRANSFORM ... USING) and calls no Java method by reflection, and the
 * session's conf differs from the server's only in allowed keys (a JDBC URL's session conf, which is set
 * without a SET statement, cannot open another catalog or file system).
 *
 * <p>The one exception is the server's own syncs: a session whose conf {@code spark.cdc.sql.writerToken}
 * equals the server's Spark Connect token ({@code spark.connect.authenticate.token}, which only the
 * server's owner can read) is not checked. Only a Spark Connect client holding the token can set it
 * before its first statement; a Thrift client that sets it to anything else is still checked.
 */
public final class ReadOnlyExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {

    static final String WRITER_KEY = "spark.cdc.sql.writerToken";
    static final String TOKEN_KEY = "spark.connect.authenticate.token";
    static final String LAKE_KEY = "spark.cdc.sql.lakeCatalog";

    /** Commands that only read; each of Spark's two forms (the v2 plan and the v1 command it may become). */
    static final Set<String> READING_COMMANDS = new HashSet<>(Arrays.asList(
        "ShowTables", "ShowTablesCommand", "ShowTablesExtended", "ShowTablePartition",
        "ShowViews", "ShowViewsCommand", "ShowNamespaces", "ShowNamespacesCommand",
        "ShowColumns", "ShowColumnsCommand", "ShowFunctions", "ShowFunctionsCommand",
        "ShowCatalogs", "ShowCatalogsCommand", "ShowCurrentNamespace", "ShowCurrentNamespaceCommand",
        "ShowCreateTable", "ShowCreateTableCommand", "ShowCreateTableAsSerdeCommand",
        "ShowTableProperties", "ShowTablePropertiesCommand", "ShowPartitions", "ShowPartitionsCommand",
        "DescribeRelation", "DescribeTableCommand", "DescribeRelationJsonCommand", "DescribeColumn",
        "DescribeColumnCommand", "DescribeNamespace", "DescribeDatabaseCommand", "DescribeFunction",
        "DescribeFunctionCommand", "DescribeQueryCommand",
        "SetCatalogAndNamespace", "SetCatalogCommand", "SetNamespaceCommand",
        "ExplainCommand", "SetCommand", "ResetCommand"));

    /** Session conf a reader may change (SET, or a JDBC URL's session conf): how results are computed and shown. */
    static final Set<String> SETTABLE_KEYS = new HashSet<>(Arrays.asList(
        "spark.sql.session.timeZone", "spark.sql.ansi.enabled", "spark.sql.shuffle.partitions",
        "spark.sql.legacy.timeParserPolicy", "spark.sql.datetime.java8API.enabled",
        "spark.sql.thriftServer.incrementalCollect", "spark.sql.execution.arrow.pyspark.enabled",
        // Keys the Thrift server sets in each session it opens.
        "spark.sql.hive.version", "spark.sql.thriftserver.scheduler.pool", "spark.sql.binaryOutputStyle",
        // The JVMs' options, which Spark's start extends in its own conf: nothing once the JVM runs.
        "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"));

    /** Leaf plans that read no stored data: VALUES, SELECT without FROM, range(), a CTE's reference. */
    static final Set<String> DATALESS_LEAVES = new HashSet<>(Arrays.asList(
        "LocalRelation", "OneRowRelation", "Range", "CTERelationRef", "EmptyRelation"));

    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectCheckRule(new AbstractFunction1<SparkSession, scala.Function1<LogicalPlan, BoxedUnit>>() {
            @Override
            public scala.Function1<LogicalPlan, BoxedUnit> apply(SparkSession session) {
                return new Check(session);
            }
        });
        return BoxedUnit.UNIT;
    }

    /** The exception a refused statement fails with; its message is what the client sees. */
    public static final class Refused extends RuntimeException {
        Refused(String what) {
            super("READ_ONLY: this SQL server only reads (cdc_assets, docs/consumers.md): " + what);
        }
    }

    static final class Check extends AbstractFunction1<LogicalPlan, BoxedUnit> {
        private final SparkSession session;

        Check(SparkSession session) {
            this.session = session;
        }

        @Override
        public BoxedUnit apply(LogicalPlan plan) {
            SparkConf server = session.sparkContext().getConf();
            if (isWriter(server)) {
                return BoxedUnit.UNIT;
            }
            checkSessionConf(server);
            checkRoot(plan);
            if (plan instanceof Command) {
                // An allowed command (checkRoot) reads the catalog: its children name what it describes
                // (ResolvedTable, ResolvedNamespace) and are not run.
                return BoxedUnit.UNIT;
            }
            String lake = server.get(LAKE_KEY, "lake");
            plan.foreachWithSubqueries(new AbstractFunction1<LogicalPlan, BoxedUnit>() {
                @Override
                public BoxedUnit apply(LogicalPlan node) {
                    checkNode(node, lake);
                    for (Expression expression : CollectionConverters.asJava(node.expressions())) {
                        expression.foreach(new AbstractFunction1<Expression, BoxedUnit>() {
                            @Override
                            public BoxedUnit apply(Expression e) {
                                checkExpression(e);
                                return BoxedUnit.UNIT;
                            }
                        });
                    }
                    return BoxedUnit.UNIT;
                }
            });
            return BoxedUnit.UNIT;
        }

        private boolean isWriter(SparkConf server) {
            Option<String> token = server.getOption(TOKEN_KEY);
            if (token.isEmpty() || token.get().isEmpty()) {
                return false;
            }
            String claimed = session.conf().get(WRITER_KEY, "");
            return java.security.MessageDigest.isEqual(claimed.getBytes(java.nio.charset.StandardCharsets.UTF_8),
                token.get().getBytes(java.nio.charset.StandardCharsets.UTF_8));
        }

        private void checkSessionConf(SparkConf server) {
            Map<String, String> conf = CollectionConverters.asJava(session.conf().getAll());
            java.util.TreeSet<String> changed = new java.util.TreeSet<>();
            for (Map.Entry<String, String> entry : conf.entrySet()) {
                String key = entry.getKey();
                Option<String> serverValue = server.getOption(key);
                boolean same = serverValue.isDefined() && serverValue.get().equals(entry.getValue());
                // hive.*: what Hive's session layer sets in each session (fetch size, proxy user); Spark reads
                // no hive.* key of a session: its metastore client is the server's, made at the start.
                if (!same && !SETTABLE_KEYS.contains(key) && !key.equals(WRITER_KEY) && !key.startsWith("hive.")) {
                    changed.add(key);
                }
            }
            if (!changed.isEmpty()) {
                throw new Refused("this session's conf sets " + String.join(", ", changed) + ", which a reader may not "
                    + "change (a reader may set: " + String.join(", ", new java.util.TreeSet<>(SETTABLE_KEYS)) + ")");
            }
        }

        private static void checkRoot(LogicalPlan plan) {
            if (plan instanceof Command && !READING_COMMANDS.contains(plan.getClass().getSimpleName())) {
                checkNode(plan, "");  // refused, named
            }
            if (plan instanceof SetCommand) {
                Option<Tuple2<String, Option<String>>> kv = ((SetCommand) plan).kv();
                if (kv.isDefined() && kv.get()._2().isDefined() && !SETTABLE_KEYS.contains(kv.get()._1())) {
                    throw new Refused("SET " + kv.get()._1() + " is refused (a reader may set: "
                        + String.join(", ", new java.util.TreeSet<>(SETTABLE_KEYS)) + ")");
                }
            }
        }

        private static void checkNode(LogicalPlan node, String lake) {
            String name = node.getClass().getSimpleName();
            if (node instanceof Command) {
                if (!READING_COMMANDS.contains(name)) {
                    throw new Refused(describe(name) + " is refused: only queries (SELECT, WITH, VALUES), SHOW, "
                        + "DESCRIBE, EXPLAIN, USE and SET run here");
                }
                return;
            }
            if (name.equals("ScriptTransformation")) {
                throw new Refused("TRANSFORM ... USING (a script transform) is refused");
            }
            if (node instanceof LogicalRelation) {
                Option<CatalogTable> table = ((LogicalRelation) node).catalogTable();
                if (table.isEmpty()) {
                    throw new Refused("reading files by path is refused: query a table or view by name");
                }
                return;
            }
            if (node instanceof DataSourceV2Relation) {
                DataSourceV2Relation relation = (DataSourceV2Relation) node;
                Option<CatalogPlugin> catalog = relation.catalog();
                Option<Identifier> identifier = relation.identifier();
                if (catalog.isEmpty() || identifier.isEmpty()) {
                    throw new Refused("reading a source that is not a named table is refused");
                }
                String catalogName = catalog.get().name();
                if (!catalogName.equals(lake) && !catalogName.equals("spark_catalog")) {
                    throw new Refused("catalog " + catalogName + " is refused: tables are read from " + lake);
                }
                for (String part : identifier.get().namespace()) {
                    checkNamePart(part);
                }
                checkNamePart(identifier.get().name());
                return;
            }
            if (name.equals("HiveTableRelation") || name.equals("View") || name.equals("SubqueryAlias")) {
                return;
            }
            if (node.children().isEmpty() && !DATALESS_LEAVES.contains(name)) {
                throw new Refused("reading " + name + " is refused: query a table or view by name");
            }
        }

        private static void checkNamePart(String part) {
            // Iceberg's catalog opens a table by path when a name looks like one.
            if (part.contains("/") || part.contains(":")) {
                throw new Refused("a table name that is a path is refused: " + part);
            }
        }

        private static void checkExpression(Expression expression) {
            String name = expression.getClass().getSimpleName();
            if (name.equals("CallMethodViaReflection") || name.equals("TryReflect")) {
                throw new Refused("reflect/java_method (calling Java by reflection) is refused");
            }
            if (name.startsWith("Hive") && (name.endsWith("UDF") || name.endsWith("UDAFFunction") || name.endsWith("UDTF"))) {
                throw new Refused("Hive functions (" + name + ") are refused");
            }
            if (name.equals("ScalaUDF") || name.equals("PythonUDF") || name.equals("ScalaUDAF")) {
                throw new Refused("user-defined functions are refused");
            }
        }

        private static String describe(String commandName) {
            return commandName.replaceAll("(Command|Exec)$", "").replaceAll("([a-z])([A-Z])", "$1 $2").toUpperCase();
        }
    }
}
