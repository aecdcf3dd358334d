package pattern

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// classify returns the kind and the operation (PostgreSQL's command tag, as
// db.operation.name) of one top-level statement.
func classify(n *pg.Node) (kind, op string) {
	if kind, op, ok := dataStatement(n); ok {
		return kind, op
	}
	if kind, op, ok := variantStatement(n); ok {
		return kind, op
	}
	if n.GetNode() == nil {
		return vocab.KindOther, ""
	}
	name := string(n.ProtoReflect().WhichOneof(oneofNode).Message().Name())
	if op, ok := utilityOps[name]; ok {
		return vocab.KindUtility, op
	}
	if op, ok := ddlOps[name]; ok {
		return vocab.KindDDL, op
	}
	if strings.HasPrefix(name, "Create") || strings.HasPrefix(name, "Alter") || strings.HasPrefix(name, "Drop") {
		return vocab.KindDDL, words(name)
	}
	return vocab.KindOther, words(name)
}

// dataStatement classifies the statements that read or write rows: SELECT (but
// SELECT ... INTO, which creates a table), INSERT, UPDATE, DELETE, MERGE and COPY.
func dataStatement(n *pg.Node) (kind, op string, ok bool) {
	switch x := n.GetNode().(type) {
	case *pg.Node_SelectStmt:
		if x.SelectStmt.IntoClause != nil {
			return vocab.KindDDL, "SELECT", true // SELECT ... INTO creates a table
		}
		return vocab.KindSelect, "SELECT", true
	case *pg.Node_InsertStmt:
		return vocab.KindInsert, "INSERT", true
	case *pg.Node_UpdateStmt:
		return vocab.KindUpdate, "UPDATE", true
	case *pg.Node_DeleteStmt:
		return vocab.KindDelete, "DELETE", true
	case *pg.Node_MergeStmt:
		return vocab.KindMerge, "MERGE", true
	case *pg.Node_CopyStmt:
		return vocab.KindCopy, "COPY", true
	}
	return "", "", false
}

// variantStatement classifies the statements whose command tag is not their
// node's alone: it depends on a field (VACUUM or ANALYZE, GRANT or REVOKE, the
// object a DROP drops), or differs from the node's name.
func variantStatement(n *pg.Node) (kind, op string, ok bool) {
	switch x := n.GetNode().(type) {
	case *pg.Node_TruncateStmt:
		return vocab.KindDDL, "TRUNCATE TABLE", true
	case *pg.Node_TransactionStmt:
		return vocab.KindUtility, transactionOp(x.TransactionStmt.Kind), true
	case *pg.Node_VariableSetStmt:
		switch x.VariableSetStmt.Kind {
		case pg.VariableSetKind_VAR_RESET, pg.VariableSetKind_VAR_RESET_ALL:
			return vocab.KindUtility, "RESET", true
		}
		return vocab.KindUtility, "SET", true
	case *pg.Node_VacuumStmt:
		return vocab.KindUtility, either(x.VacuumStmt.IsVacuumcmd, "VACUUM", "ANALYZE"), true
	case *pg.Node_FetchStmt:
		return vocab.KindUtility, either(x.FetchStmt.Ismove, "MOVE", "FETCH"), true
	case *pg.Node_GrantStmt:
		return vocab.KindDDL, either(x.GrantStmt.IsGrant, "GRANT", "REVOKE"), true
	case *pg.Node_GrantRoleStmt:
		return vocab.KindDDL, either(x.GrantRoleStmt.IsGrant, "GRANT ROLE", "REVOKE ROLE"), true
	case *pg.Node_CreateTableAsStmt:
		matview := x.CreateTableAsStmt.Objtype == pg.ObjectType_OBJECT_MATVIEW
		return vocab.KindDDL, either(matview, "CREATE MATERIALIZED VIEW", "CREATE TABLE AS"), true
	case *pg.Node_DropStmt:
		return vocab.KindDDL, "DROP " + objectWords(x.DropStmt.RemoveType), true
	case *pg.Node_AlterTableStmt:
		return vocab.KindDDL, "ALTER " + objectWords(x.AlterTableStmt.Objtype), true
	case *pg.Node_RenameStmt:
		t := x.RenameStmt.RenameType
		if t == pg.ObjectType_OBJECT_COLUMN || t == pg.ObjectType_OBJECT_TABCONSTRAINT {
			t = x.RenameStmt.RelationType
		}
		return vocab.KindDDL, "ALTER " + objectWords(t), true
	case *pg.Node_AlterSystemStmt:
		return vocab.KindUtility, "ALTER SYSTEM", true
	case *pg.Node_RefreshMatViewStmt:
		return vocab.KindUtility, "REFRESH MATERIALIZED VIEW", true
	}
	return "", "", false
}

// either returns a when cond holds, else b.
func either(cond bool, a, b string) string {
	if cond {
		return a
	}
	return b
}

var oneofNode = (&pg.Node{}).ProtoReflect().Descriptor().Oneofs().ByName("node")

// utilityOps names the utility statements whose command tag is not simply
// derived from the node name.
var utilityOps = map[string]string{
	"VariableShowStmt":   "SHOW",
	"ExplainStmt":        "EXPLAIN",
	"ListenStmt":         "LISTEN",
	"UnlistenStmt":       "UNLISTEN",
	"NotifyStmt":         "NOTIFY",
	"LockStmt":           "LOCK TABLE",
	"CheckPointStmt":     "CHECKPOINT",
	"DiscardStmt":        "DISCARD",
	"PrepareStmt":        "PREPARE",
	"ExecuteStmt":        "EXECUTE",
	"DeallocateStmt":     "DEALLOCATE",
	"DeclareCursorStmt":  "DECLARE CURSOR",
	"ClosePortalStmt":    "CLOSE CURSOR",
	"LoadStmt":           "LOAD",
	"ReindexStmt":        "REINDEX",
	"ClusterStmt":        "CLUSTER",
	"CallStmt":           "CALL",
	"DoStmt":             "DO",
	"ConstraintsSetStmt": "SET CONSTRAINTS",
}

// ddlOps names the schema-changing statements whose node name does not start
// with Create, Alter or Drop, or whose tag differs from the node name.
var ddlOps = map[string]string{
	"CreateStmt":                 "CREATE TABLE",
	"IndexStmt":                  "CREATE INDEX",
	"ViewStmt":                   "CREATE VIEW",
	"RuleStmt":                   "CREATE RULE",
	"CreateTrigStmt":             "CREATE TRIGGER",
	"CreatedbStmt":               "CREATE DATABASE",
	"DropdbStmt":                 "DROP DATABASE",
	"CreateSeqStmt":              "CREATE SEQUENCE",
	"AlterSeqStmt":               "ALTER SEQUENCE",
	"DefineStmt":                 "CREATE",
	"CompositeTypeStmt":          "CREATE TYPE",
	"CreateEnumStmt":             "CREATE TYPE",
	"CreateRangeStmt":            "CREATE TYPE",
	"AlterObjectSchemaStmt":      "ALTER",
	"AlterOwnerStmt":             "ALTER",
	"CommentStmt":                "COMMENT",
	"SecLabelStmt":               "SECURITY LABEL",
	"ReassignOwnedStmt":          "REASSIGN OWNED",
	"DropOwnedStmt":              "DROP OWNED",
	"ImportForeignSchemaStmt":    "IMPORT FOREIGN SCHEMA",
	"CreateSchemaStmt":           "CREATE SCHEMA",
	"CreateFunctionStmt":         "CREATE FUNCTION",
	"AlterDefaultPrivilegesStmt": "ALTER DEFAULT PRIVILEGES",
}

func transactionOp(k pg.TransactionStmtKind) string {
	switch k {
	case pg.TransactionStmtKind_TRANS_STMT_BEGIN:
		return "BEGIN"
	case pg.TransactionStmtKind_TRANS_STMT_START:
		return "START TRANSACTION"
	case pg.TransactionStmtKind_TRANS_STMT_COMMIT:
		return "COMMIT"
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK:
		return "ROLLBACK"
	case pg.TransactionStmtKind_TRANS_STMT_SAVEPOINT:
		return "SAVEPOINT"
	case pg.TransactionStmtKind_TRANS_STMT_RELEASE:
		return "RELEASE"
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_TO:
		return "ROLLBACK"
	case pg.TransactionStmtKind_TRANS_STMT_PREPARE:
		return "PREPARE TRANSACTION"
	case pg.TransactionStmtKind_TRANS_STMT_COMMIT_PREPARED:
		return "COMMIT PREPARED"
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK_PREPARED:
		return "ROLLBACK PREPARED"
	}
	return "TRANSACTION"
}

// objectWords turns OBJECT_FOREIGN_TABLE into "FOREIGN TABLE".
func objectWords(t pg.ObjectType) string {
	switch t {
	case pg.ObjectType_OBJECT_MATVIEW:
		return "MATERIALIZED VIEW"
	case pg.ObjectType_OBJECT_FDW:
		return "FOREIGN DATA WRAPPER"
	}
	return strings.ReplaceAll(strings.TrimPrefix(t.String(), "OBJECT_"), "_", " ")
}

// words turns a node name into a command: "CreateFunctionStmt" -> "CREATE
// FUNCTION".
func words(name string) string {
	name = strings.TrimSuffix(name, "Stmt")
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		c := name[i]
		if i > 0 && c >= 'A' && c <= 'Z' {
			b.WriteByte(' ')
		}
		b.WriteByte(c)
	}
	return strings.ToUpper(b.String())
}

// explainable reports whether EXPLAIN can plan n without side effects: a
// SELECT (not SELECT ... INTO), INSERT, UPDATE, DELETE or MERGE.
func explainable(n *pg.Node) bool {
	switch x := n.GetNode().(type) {
	case *pg.Node_SelectStmt:
		return x.SelectStmt.IntoClause == nil
	case *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt, *pg.Node_MergeStmt:
		return true
	}
	return false
}

// dmlNode reports a SELECT, INSERT, UPDATE, DELETE or MERGE.
func dmlNode(n *pg.Node) bool {
	switch n.GetNode().(type) {
	case *pg.Node_SelectStmt, *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt, *pg.Node_MergeStmt:
		return true
	}
	return false
}
